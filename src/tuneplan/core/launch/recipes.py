"""Which trainer a launch bundle may run for the plan's ``--recipe``.

The bundle's train.py (and the accelerate / DeepSpeed / axolotl / LLaMA-Factory files built
around it) trains with the HF Trainer and PEFT: the memory layout of ``--recipe hf`` (and
``plain``, which keeps hf's dtypes and layout). A plan made with another recipe was sized with
that framework's own layout (``core.memory.litgpt``, ``torchtune``, ``unsloth``), so an
HF-based file would start a different job than the one planned: those targets are refused
with a one-line reason, never written for it. Pure decisions, no text files.
"""

from __future__ import annotations

from tuneplan.core.job.recipes import Recipe
from tuneplan.core.launch.targets import Refusal

#: Recipes whose memory layout is the HF Trainer + PEFT one train.py runs.
HF_TRAINER_RECIPES = frozenset({Recipe.HF, Recipe.PLAIN})
#: The framework each other recipe names, as its project spells it.
FRAMEWORK_NAMES = {Recipe.LITGPT: "LitGPT", Recipe.TORCHTUNE: "torchtune",
                   Recipe.UNSLOTH: "Unsloth"}
def runs_hf_trainer(recipe: Recipe) -> bool:
    return recipe in HF_TRAINER_RECIPES


def hf_trainer_refusal(recipe: Recipe, tools: str, *, instead: str = "") -> Refusal | None:
    """Why ``tools`` (HF-based targets, comma-separated) cannot run a plan made with
    ``recipe``; None when they can (hf, plain). ``instead``: what the bundle runs for it."""
    if runs_hf_trainer(recipe):
        return None
    name = FRAMEWORK_NAMES[recipe]
    why = (f"the plan was made with --recipe {recipe.value} (memory and time of {name}'s own "
           f"layout) and {'they train' if ',' in tools else 'it trains'} with the HF "
           "Trainer + PEFT (train.py or the framework's own), whose memory differs")
    if recipe is Recipe.UNSLOTH:
        why += ("; no Unsloth files are written either (the plan's memory assumes Unsloth's "
                "kernels, and Unsloth needs CUDA to start, so no config of it could be "
                "start-tested)")
    if instead:
        return Refusal(tools, f"{why}: {instead}, or re-plan with --recipe hf")
    return Refusal(tools, f"{why}: re-plan with --recipe hf to launch it there")
