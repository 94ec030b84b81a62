"""Scenarios an experienced ML engineer would sign off: each asserts the answer they would give
(which card, which settings, which risk named), not that something printed.

Hand-made offers (``tests/core/test_planner.py``'s ``offer``/``run``) where the scenario is
about a trade-off; the bundled catalog where it is about the real market. The impossible
budget/deadline pair lives in ``tests/core/test_planner_answers.py`` (not repeated here).
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from tests.core.test_planner import MIXED, NOW, PROVIDERS, SPECS, offer, run
from tuneplan.adapters.hub import resolve_model
from tuneplan.adapters.importers.snapshot import load_bundled_snapshot
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import (
    Checkpointing,
    Job,
    Loss,
    Objective,
    Offload,
    Optimizer,
    Precision,
    Strategy,
)
from tuneplan.core.planner.plan import PlanResult, plan_offers
from tuneplan.core.planner.risk import assess
from tuneplan.core.planner.search import memory_limit
from tuneplan.units import GB, HOUR_S, GiB

LLAMA8B = "meta-llama/Llama-3.1-8B"
LLAMA70B = "meta-llama/Llama-3.1-70B"


@pytest.fixture(scope="module")
def market() -> list[Offer]:
    return [o for _, result, _ in load_bundled_snapshot() for o in result.offers]


def run_linked(model: str, offers: list[Offer], **job: object) -> PlanResult:
    """``run`` with a job of its own (the providers' fabric per instance type, as
    ``adapters.plans.plan`` plans)."""
    spec = resolve_model(model)
    settings: dict[str, object] = {"tokens": 50_000_000} | job
    return plan_offers(spec, Job(model=model, **settings),  # type: ignore[arg-type]
                       offers, SPECS, PROVIDERS, now=NOW)


@pytest.mark.parametrize("objective", [Objective.COST, Objective.RISK, Objective.PARETO])
def test_8b_qlora_is_one_mid_range_card_never_a_multi_gpu_node(
        market: list[Offer], objective: Objective) -> None:
    result = run(LLAMA8B, "qlora", market, objective=objective)
    best = result.plans[0]
    assert best.offer.gpu_count == 1
    assert 24 * GiB <= best.capacity_bytes <= 48 * GiB
    assert best.risk is not None and best.risk.memory_fill < 0.80   # comfortable headroom


def _70b_nodes() -> tuple[Strategy, list[Offer]]:
    lean = Strategy(method=Method.FULL, precision=Precision.BF16, optimizer=Optimizer.ADAMW8BIT)
    return lean, [offer("A100 80GB SXM4", 8, "16.00", interconnect="NVLink 3.0", name="sxm"),
                  offer("A100 80GB PCIe", 8, "12.00", name="pcie")]


@pytest.mark.parametrize("objective", [Objective.TIME, Objective.RISK])
def test_70b_full_an_nvswitch_node_wins_over_pcie_on_time_and_risk(objective: Objective) -> None:
    lean, offers = _70b_nodes()
    result = run(LLAMA70B, "full", offers, strategy=lean, objective=objective)
    first, second = result.plans
    assert (first.offer.instance_type, first.link) == ("sxm", "nvswitch")
    assert second.link == "pcie" and second.best_cost < first.best_cost   # dearer, yet first
    assert second.risk is not None and first.risk is not None
    assert second.risk.fabric_share > 0.1 and first.risk.fabric == 0.0
    if objective is Objective.RISK:
        assert first.risk_cost < second.risk_cost


def test_70b_full_on_cost_the_pcie_plan_says_what_its_all_gathers_cost() -> None:
    lean, offers = _70b_nodes()
    result = run(LLAMA70B, "full", offers, strategy=lean)
    pcie = result.plans[0]
    assert pcie.offer.instance_type == "pcie" and pcie.strategy.sharding.value in ("fsdp", "zero3")
    assert pcie.risk is not None
    risks = next(line for line in pcie.why if line.startswith("risks:"))
    gb = pcie.candidate.throughput.comm_bytes_per_step_per_gpu / GB
    assert f"all-gathers {gb:,.1f} GB per GPU per step over PCIe" in risks
    dollars = pcie.best_cost * Decimal(str(round(pcie.risk.fabric_share, 4)))
    assert f"about ${dollars:,.2f} of this plan's ${pcie.best_cost:,.2f}" in risks
    assert "vs #1" in result.plans[1].why[2]   # the NVSwitch plan says what it costs more
    # and #1 says what it wins by, and what it gives up
    assert any(line.startswith("vs #2: $") and "less" in line and "slower" in line
               for line in pcie.why)


MOE = "mistralai/Mixtral-8x7B-v0.1"


def test_moe_lora_streams_no_weights_from_host_where_something_else_fits() -> None:
    offers = [offer("A100 80GB SXM4", 1, "1.90"), offer("H100 SXM5", 1, "2.99"),
              offer("A100 80GB SXM4", 2, "3.80", interconnect="NVLink 3.0"),
              offer("A100 80GB SXM4", 4, "7.60", interconnect="NVLink 3.0"),
              offer("L40S", 4, "4.80"), offer("L40S", 8, "9.60")]
    result = run(MOE, "lora", offers)
    assert result.plans
    assert all(p.strategy.offload is not Offload.OPTIMIZER_PARAMS for p in result.plans)
    assert all(p.risk is not None and p.risk.host_gb_per_step == 0 for p in result.plans)
    # Its 46.7B bf16 weights (93 GB) fit no single 80 GB card: every plan shards them.
    assert all(p.strategy.world_size > 1 for p in result.plans)


def test_moe_lora_that_only_fits_by_streaming_says_the_gb_per_step() -> None:
    result = run(MOE, "lora", [offer("L40S", 2, "1.80")])   # 88 GB of cards, 93 GB of weights
    (plan,) = result.plans
    assert plan.strategy.offload is Offload.OPTIMIZER_PARAMS
    assert plan.risk is not None
    params = plan.candidate.memory.total_params
    # both passes stream the bf16 weights, split over the 2 ranks
    assert plan.risk.host_gb_per_step == pytest.approx(
        2 * params * 2 / 2 * plan.strategy.grad_accum / GB, rel=1e-6)
    risks = next(line for line in plan.why if line.startswith("risks:"))
    assert (f"weights streamed from host RAM every forward and backward pass: "
            f"{plan.risk.host_gb_per_step:,.1f} GB per GPU per step over PCIe") in risks


@pytest.mark.parametrize("objective", [Objective.COST, Objective.RISK])
def test_a_tiny_model_full_fine_tune_never_rents_a_multi_gpu_node(objective: Objective) -> None:
    result = run("Qwen/Qwen2.5-0.5B", "full", MIXED, objective=objective)
    assert result.plans[0].offer.gpu_count == 1
    assert result.plans[0].strategy.method is Method.FULL


LONG = Strategy(method=Method.LORA, seq_len=32_768)
ONE_CARD = [offer("L40S", 1, "0.90"), offer("A100 80GB SXM4", 1, "1.90"),
            offer("H100 SXM5", 1, "2.99")]


def test_long_context_lora_fits_a_cheaper_card_with_the_chunked_loss() -> None:
    free = run(LLAMA8B, "lora", ONE_CARD, strategy=LONG)
    best = free.plans[0]
    assert best.gpu.name == "L40S" and best.strategy.loss is Loss.CHUNKED
    assert any(line.startswith("chunked loss (--loss chunked") for line in best.why)
    assert any("use_liger_kernel" in w and "liger-kernel in requirements.txt" in w
               for w in best.warnings)   # the launch files run the fused loss
    # With the standard loss kept (--loss standard given), the L40S is out: a dearer card wins.
    kept = run(LLAMA8B, "lora", ONE_CARD, strategy=replace(LONG, loss=Loss.STANDARD),
               fixed=("loss",))
    assert kept.plans[0].gpu.name != "L40S"
    assert kept.plans[0].best_cost > best.best_cost
    assert all(p.strategy.loss is Loss.STANDARD for p in kept.plans)
    assert any(r.offer.gpu == "L40S" and r.kind == "memory" for r in kept.rejected)


def test_405b_qlora_on_risk_avoids_tight_memory_and_pcie_all_gathers(
        market: list[Offer]) -> None:
    by_cost = run("meta-llama/Llama-3.1-405B", "qlora", market)
    by_risk = run("meta-llama/Llama-3.1-405B", "qlora", market, objective=Objective.RISK)
    # 405B 4-bit weights are ~203 GB: a plan on less GPU memory in total streams them from
    # host RAM every pass, and says how much.
    for p in by_cost.plans:
        assert p.risk is not None
        if p.strategy.world_size * p.capacity_bytes < 203 * GB:
            assert p.strategy.offload is Offload.OPTIMIZER_PARAMS
            assert p.risk.host_gb_per_step > 203 / p.strategy.world_size
    safe = by_risk.plans[0]
    assert safe.risk is not None
    # within the planner's limit (usable x 0.95); its fill is priced, not forbidden
    assert safe.risk.memory_fill <= 0.95 and safe.risk.fabric_share <= 0.25
    assert safe.risk_cost == min(p.risk_cost for p in by_risk.plans)
    if safe.strategy.offload is not Offload.NONE:
        # Streaming the 4-bit weights from host RAM can still win on risk-priced cost (FSDP1
        # keeps its root unit, 8.4 GB of bf16 embedding and head, gathered on every GPU, so
        # the all-resident plans need more cards): then its streaming is priced and said,
        # and the cheapest all-resident plan carries less risk per dollar.
        assert safe.risk.streaming > 0
        assert any(r.startswith("weights streamed from host RAM") for r in safe.risk.reasons)
        resident = [p for p in by_risk.plans if p.strategy.offload is Offload.NONE]
        assert resident and resident[0].risk is not None
        assert resident[0].risk.penalty < safe.risk.penalty
    cheap = by_cost.plans[0]
    assert cheap.risk is not None
    if cheap.id != safe.id:   # the cheapest carries a risk the safe plan does not, and says so
        assert cheap.risk.penalty > safe.risk.penalty
        assert any(line.startswith("risks: ") and "none beyond" not in line
                   for line in cheap.why)


P5 = offer("H100 SXM5", 8, "31.46", provider="AWS", interconnect="NVLink 4.0",
           name="p5.48xlarge")


def test_a_job_that_needs_two_nodes_gets_exactly_two() -> None:
    # 70B full fine-tuning without host offload does not fit one 8x H100 node.
    strategy = Strategy(method=Method.FULL, offload=Offload.NONE)
    one = run_linked(LLAMA70B, [P5], strategy=strategy, fixed=("offload",), multi_node=False)
    assert not one.plans and one.infeasible is not None
    assert any(r.constraint == "flag:multi-node" and r.plan is not None and r.plan.nodes == 2
               for r in one.infeasible.relaxations)
    # by default (no --multi-node, no --no-multi-node) an offer one node of which cannot hold
    # the job is tried on more nodes; --multi-node gives the same here
    for multi in (None, True):
        two = run_linked(LLAMA70B, [P5], strategy=strategy, fixed=("offload",),
                         multi_node=multi)
        assert two.plans and {p.strategy.nodes for p in two.plans} == {2}
        assert all(p.strategy.offload is Offload.NONE for p in two.plans)


def test_more_nodes_are_planned_when_one_node_misses_the_deadline() -> None:
    job = {"strategy": Strategy(method=Method.FULL), "tokens": 2_000_000_000,
           "multi_node": True}
    relaxed = run_linked(LLAMA8B, [P5], **job)
    assert [p.strategy.nodes for p in relaxed.plans] == [1]
    deadline = 0.7 * relaxed.plans[0].best_hours * HOUR_S
    rushed = run_linked(LLAMA8B, [P5], **job, deadline_s=deadline)
    assert rushed.plans and all(p.strategy.nodes > 1 for p in rushed.plans)
    assert all(p.best_hours * HOUR_S <= deadline for p in rushed.plans)


def test_spot_wins_on_cost_and_loses_on_risk_when_it_saves_less_than_it_risks() -> None:
    spot = offer("A100 80GB SXM4", 1, "2.00", provider="RunPod", spot="1.84", name="spot")
    steady = offer("A100 80GB SXM4", 1, "2.00", provider="Lambda", name="steady")
    cheap = run(LLAMA8B, "lora", [spot, steady], spot=True)
    assert cheap.plans[0].offer.instance_type == "spot" and cheap.plans[0].uses_spot
    risky = run(LLAMA8B, "lora", [spot, steady], spot=True, objective=Objective.RISK)
    assert risky.plans[0].offer.instance_type == "steady"
    on_spot = risky.plans[1]
    assert on_spot.risk is not None and on_spot.risk.spot > 0
    risks = next(line for line in on_spot.why if line.startswith("risks:"))
    assert "interruptions add" in risks and "no notice long enough" in risks  # RunPod: none
    # Half the price is worth the interruptions, risk priced in.
    half = replace(spot, spot_price_per_hour=Decimal("1.00"))
    assert run(LLAMA8B, "lora", [half, steady], spot=True,
               objective=Objective.RISK).plans[0].offer.instance_type == "spot"


def test_full_fine_tuning_on_a_t4_trains_in_fp16_with_loss_scaling() -> None:
    t4 = [offer("T4", 1, "0.35")]
    result = run("Qwen/Qwen2.5-0.5B", "full", t4)
    (plan,) = result.plans
    assert plan.strategy.precision is Precision.FP16_MIXED
    assert any("no BF16 on T4" in w and "loss scaling" in w for w in plan.warnings)
    # ... and the risk objective prices it: fp16 is what an L4 (bf16) at the same price
    # would not risk.
    assert plan.risk is not None and plan.risk.precision == pytest.approx(0.10)
    assert any(r.startswith("fp16 with dynamic loss scaling") for r in plan.risk.reasons)
    both = run("Qwen/Qwen2.5-0.5B", "full", [*t4, offer("L4", 1, "0.35")],
               objective=Objective.RISK)
    assert both.plans[0].offer.gpu == "L4" and both.plans[0].risk.precision == 0.0
    # What it takes: Qwen's 152k-word vocabulary makes the logits big; with the chunked loss
    # 16 GB holds 0.5B full without recompute, faster than the standard loss, which fits
    # only with checkpointing on (with AdamW kept too: an 8-bit AdamW would also free it).
    assert plan.strategy.loss is Loss.CHUNKED and plan.strategy.optimizer is Optimizer.ADAMW
    assert plan.strategy.checkpointing is Checkpointing.NONE
    assert plan.candidate.device_total_bytes <= plan.capacity_bytes * 0.95
    standard = run("Qwen/Qwen2.5-0.5B", "full", t4, fixed=("loss", "optimizer"),
                   strategy=Strategy(method=Method.FULL, loss=Loss.STANDARD)).plans[0]
    assert standard.strategy.checkpointing is Checkpointing.FULL
    assert standard.best_hours > plan.best_hours
    # Qwen2.5-1.5B full no longer fits a T4 at all: its tied embedding's backward makes a
    # 0.93 GB fp32 weight gradient beside every other gradient (the moment measured on an
    # H200 for a tied 3B), past what paging its 8-bit AdamW state can free.
    assert not run("Qwen/Qwen2.5-1.5B", "full", t4).plans
    # Phi-1.5 (1.4B, untied) fits it only with bitsandbytes' paged 8-bit AdamW: what of its
    # state does not fit beside the rest at the peak waits in host RAM, paid in every step.
    bigger = run("microsoft/phi-1_5", "full", t4)
    (paged,) = bigger.plans
    c = paged.candidate
    assert paged.strategy.optimizer is Optimizer.PAGED_ADAMW8BIT
    assert paged.strategy.precision is Precision.FP16_MIXED
    assert c.paged_out_bytes > 0
    assert c.device_total_bytes <= int(paged.capacity_bytes * 0.95)   # the card at its limit
    assert c.device_total_bytes + c.paged_out_bytes > int(paged.capacity_bytes * 0.95)
    paging = c.throughput.step.get("step/paged-optimizer")
    assert paging is not None and paging.value == pytest.approx(2 * c.paged_out_bytes / 20e9)
    assert c.host_ram_bytes >= c.paged_out_bytes
    assert any("pages to host RAM" in line for line in paged.why)
    assert paged.risk is not None and paged.risk.streaming > 0
    assert paged.risk.host_gb_per_step == pytest.approx(2 * c.paged_out_bytes / GB)
    risks = next(line for line in paged.why if line.startswith("risks:"))
    assert "paged optimizer state to and from host RAM" in risks
    assert any(line.startswith(f"paged optimizer: {c.paged_out_bytes / GiB:.1f} GiB per GPU")
               for line in paged.why)
    # With the optimizer fixed to plain AdamW, memory binds, and the changes that fit are
    # named: freeing the optimizer gives the paged plan; another method fits the card.
    plain = run("microsoft/phi-1_5", "full", t4, fixed=("optimizer",))
    assert not plain.plans and plain.infeasible is not None
    assert plain.infeasible.binding[0].constraint == "memory"
    freed = next(r for r in plain.infeasible.relaxations if r.constraint == "flag:optimizer")
    assert freed.plan is not None and freed.plan.id == paged.id
    assert any(r.constraint == "flag:method" and r.plan is not None
               for r in plain.infeasible.relaxations)
    # An 8-bit AdamW that is not paged (fixed) does not fit: the paging is what fits it.
    unpaged = run("microsoft/phi-1_5", "full", t4, fixed=("optimizer",),
                  strategy=Strategy(method=Method.FULL, optimizer=Optimizer.ADAMW8BIT))
    assert not unpaged.plans
    # Given by the person, the paged optimizer is kept and fits the same way.
    given = run("microsoft/phi-1_5", "full", t4, fixed=("optimizer",),
                strategy=Strategy(method=Method.FULL, optimizer=Optimizer.PAGED_ADAMW8BIT))
    assert given.plans and given.plans[0].candidate.paged_out_bytes > 0


def test_memory_headroom_is_a_risk_that_grows_with_the_fill() -> None:
    plan = run(LLAMA8B, "qlora", [offer("L40S", 1, "0.90")]).plans[0]
    c = plan.candidate

    def at(fill: float) -> float:
        filled = replace(c, device_total_bytes=int(plan.capacity_bytes * fill))
        return assess(filled, link="single", capacity_bytes=plan.capacity_bytes,
                      on_spot=False, spot_extra=0.0, spot_notice=False).memory

    assert at(0.70) == 0.0 < at(0.90) < at(0.94)


def test_the_planner_keeps_a_fixed_optimizer_and_loss_out_of_its_lean_steps() -> None:
    fixed = run(LLAMA8B, "lora", ONE_CARD, fixed=("loss", "optimizer"),
                strategy=replace(LONG, loss=Loss.STANDARD, optimizer=Optimizer.ADAMW))
    assert all(p.strategy.loss is Loss.STANDARD and p.strategy.optimizer is Optimizer.ADAMW
               for p in fixed.plans)


def test_on_risk_the_same_offer_runs_a_smaller_micro_batch_with_headroom() -> None:
    pair = [offer("L40S", 2, "1.80")]
    tight = run(LLAMA8B, "qlora", pair).plans[0]
    roomy = run(LLAMA8B, "qlora", pair, objective=Objective.RISK).plans[0]
    assert tight.risk is not None and roomy.risk is not None
    # Risk never buys a fuller card, and never a higher risk-priced cost than cost's pick.
    assert roomy.risk.memory_fill <= tight.risk.memory_fill
    assert roomy.risk_cost <= tight.risk_cost
    if tight.risk.memory_fill > 0.80:  # cost's pick is in the risky band: risk backs off
        assert roomy.strategy.batch_size < tight.strategy.batch_size
        assert roomy.risk.memory_fill < tight.risk.memory_fill


def test_a_spot_notice_long_enough_to_save_a_checkpoint_is_not_a_risk() -> None:
    # AWS gives 120 s: a LoRA adapter checkpoint is written in far less; 70B full state is not.
    aws = offer("A100 80GB SXM4", 8, "32.77", provider="AWS", spot="12.00",
                interconnect="NVLink 3.0", name="p4de")
    small = run(LLAMA8B, "lora", [aws], spot=True).plans[0]
    assert small.uses_spot and small.risk is not None and small.risk.spot > 0
    assert "no notice long enough" not in " ".join(small.why)
    lean, _ = _70b_nodes()
    big = run(LLAMA70B, "full", [aws], strategy=lean, spot=True).plans[0]
    assert big.uses_spot and big.risk is not None
    assert big.risk.spot > small.risk.spot
    assert any("no notice long enough" in line for line in big.why)


def test_more_nodes_are_planned_beside_one_starved_by_host_offload_when_cheaper() -> None:
    # fp32 AdamW states (fixed) for 70B are ~1.1 TB: one 8x H100 node with a small host
    # (32 vCPUs) must run DeepSpeed's CPU Adam, most of its step. Four nodes hold the states
    # on the GPUs: cheaper and faster, planned beside the one node with --multi-node.
    job = {"strategy": Strategy(method=Method.FULL), "fixed": ("optimizer",)}
    one = run_linked(LLAMA70B, [P5], **job)
    assert [p.strategy.nodes for p in one.plans] == [1]
    alone = one.plans[0]
    assert alone.strategy.offload is not Offload.NONE
    assert alone.risk is not None and alone.risk.host_gb_per_step > 0
    cpu = alone.candidate.throughput.step.get("step/optimizer-offloaded")
    assert cpu is not None and cpu.value > 0.5 * alone.candidate.throughput.step_seconds
    both = run_linked(LLAMA70B, [P5], **job, multi_node=True)
    by_nodes = {p.strategy.nodes: p for p in both.plans}
    assert set(by_nodes) == {1, 4}     # two nodes are tried and are not cheaper per GPU
    spread = by_nodes[4]
    assert spread.strategy.offload is Offload.NONE and spread.strategy.optimizer is (
        Optimizer.ADAMW)
    assert both.plans[0] is spread and spread.best_cost < by_nodes[1].best_cost
    assert spread.best_hours < by_nodes[1].best_hours


def test_a_well_fed_node_gets_no_multi_node_plan_beside_it() -> None:
    # With the optimizer free, 70B fits one p5 (192 vCPUs) with 8-bit paged AdamW: more
    # nodes run slower per GPU (their collectives cross the fabric), so none is planned.
    p5 = replace(P5, vcpus=192)
    result = run_linked(LLAMA70B, [p5], strategy=Strategy(method=Method.FULL),
                        multi_node=True)
    assert [p.strategy.nodes for p in result.plans] == [1]


def test_70b_full_with_a_deadline_one_node_misses_runs_on_two_nodes() -> None:
    p5 = replace(P5, vcpus=192)
    job = {"strategy": Strategy(method=Method.FULL), "multi_node": True}
    relaxed = run_linked(LLAMA70B, [p5], **job)
    (one,) = relaxed.plans
    assert one.strategy.nodes == 1
    deadline = 0.85 * one.best_hours * HOUR_S
    rushed = run_linked(LLAMA70B, [p5], **job, deadline_s=deadline)
    assert rushed.plans
    best = rushed.plans[0]
    # the fewest nodes that meet it: two 8x H100 nodes (not four), every GPU's memory used
    # for a larger micro-batch instead of host RAM
    assert best.strategy.nodes == 2 and best.strategy.world_size == 16
    assert best.best_hours * HOUR_S <= deadline
    assert best.candidate.paged_out_bytes == 0 and best.strategy.offload is Offload.NONE
    assert best.strategy.batch_size > one.strategy.batch_size
    assert {p.strategy.nodes for p in rushed.plans} == {2}


def test_cpu_adam_is_no_faster_than_the_hosts_memory_allows() -> None:
    # DeepSpeed's CPU Adam streams 28 B per parameter (fp32 grad, moments and weight read,
    # weight and moments written): a p5 host (2 sockets x 8 DDR4-3200 channels, 410 GB/s
    # peak) cannot step 70B parameters in less than 70e9 x 28 / 410e9 = 4.8 s.
    p5 = replace(P5, vcpus=192)
    plan = run_linked(LLAMA70B, [p5], strategy=Strategy(method=Method.FULL),
                      fixed=("optimizer",)).plans[0]
    assert plan.strategy.offload is not Offload.NONE
    term = plan.candidate.throughput.step.get("step/optimizer-offloaded")
    assert term is not None
    params = plan.candidate.memory.trainable_params
    cpu_s = float(term.inputs["cpu_s"])   # type: ignore[arg-type]
    assert params * 28 / 410e9 <= cpu_s <= 2 * params * 28 / 410e9


@pytest.mark.parametrize("model,method,objective", [
    (LLAMA8B, "qlora", Objective.COST), (LLAMA8B, "auto", Objective.RISK),
    (LLAMA70B, "full", Objective.COST), (LLAMA70B, "full", Objective.TIME),
    (MOE, "lora", Objective.COST), ("Qwen/Qwen2.5-1.5B", "full", Objective.PARETO)])
def test_no_plan_shown_passes_the_cards_usable_memory_less_the_margin(
        market: list[Offer], model: str, method: str, objective: Objective) -> None:
    # Over the real market: every plan, the top ten (re-estimated exactly for their GPU)
    # included, keeps its whole-device peak per GPU within usable x 0.95; a paged optimizer's
    # paged-out state is in host RAM, not on the card.
    result = run(model, method, market, objective=objective)
    assert len(result.plans) >= 10
    for p in result.plans:
        limit = memory_limit(p.capacity_bytes, result.assumptions.memory_margin)
        assert p.candidate.device_total_bytes <= limit, (p.id, p.gpu.name)
        assert p.capacity_bytes <= p.gpu.usable_memory_bytes
    assert all(p.candidate.exact for p in result.plans[:10])


def test_a_given_paged_32_bit_adamw_is_kept_and_pages_what_the_card_cannot_hold() -> None:
    # 8B full with fp32 AdamW states (64 GB) is 125 GiB at micro-batch 1: no 80 GB card holds
    # it. Given paged-adamw32bit, the states page to host RAM; the planner keeps the 32-bit
    # states (not searched: where bitsandbytes runs, paged 8-bit holds them in a quarter of
    # the bytes, so 32-bit can only be the person's call on numerics).
    card = [offer("A100 80GB SXM4", 1, "1.90")]
    full = Strategy(method=Method.FULL)
    plain = run(LLAMA8B, "full", card, fixed=("optimizer",), strategy=full)
    assert not plain.plans and plain.infeasible is not None
    assert plain.infeasible.binding[0].constraint == "memory"
    given = run(LLAMA8B, "full", card, fixed=("optimizer",),
                strategy=replace(full, optimizer=Optimizer.PAGED_ADAMW32BIT))
    (plan,) = given.plans
    c = plan.candidate
    assert plan.strategy.optimizer is Optimizer.PAGED_ADAMW32BIT
    assert 0 < c.paged_out_bytes <= 64e9 and c.device_total_bytes <= plan.capacity_bytes * 0.95
    paging = c.throughput.step.get("step/paged-optimizer")
    assert paging is not None and paging.value == pytest.approx(2 * c.paged_out_bytes / 20e9)
    assert not any(line.startswith("--optimizer") for line in plan.why)  # not a change made


def test_short_samples_are_packed_unless_the_person_says_no() -> None:
    """Samples of 300 tokens in 2,048-token sequences: unpacked, most of every batch is
    padding. The planner packs them (same memory, no padded compute), says so, and is
    faster; ``--no-packing`` given keeps every plan unpacked."""
    market = [offer("L40S", 1, "1.00")]
    packed = run(LLAMA8B, "qlora", market, avg_tokens=300).plans[0]
    assert packed.strategy.packing
    assert any(w.startswith("sequence packing (--packing): samples of 300 tokens")
               for w in packed.why)
    unpacked = run(LLAMA8B, "qlora", market, avg_tokens=300, fixed=("packing",)).plans[0]
    assert not unpacked.strategy.packing
    assert not any(w.startswith("sequence packing") for w in unpacked.why)
    assert packed.best_hours < 0.6 * unpacked.best_hours
    full = run(LLAMA8B, "qlora", market, avg_tokens=4096).plans[0]   # no padding to save
    assert not full.strategy.packing


def test_unsloths_offloaded_checkpoints_are_host_traffic_priced_and_said() -> None:
    """Unsloth's offloaded activation checkpoints cross PCIe twice per layer per micro-batch:
    the plan's host GB per step and its streaming risk count them, and the risk line says so
    (they used to be called hidden and left out)."""
    from tuneplan.core.job.recipes import Recipe

    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    result = run(LLAMA8B, "lora", [offer("RTX 4090", 1, "0.69")], strategy=Strategy(
        method=Method.LORA, recipe=Recipe.UNSLOTH, checkpointing=Checkpointing.OFFLOAD,
        lora_targets=every, lora_dropout=0.0))
    plan = result.plans[0]
    assert plan.risk is not None
    term = plan.candidate.throughput.step.get("micro-batch/unsloth-checkpoint-offload-exposed")
    assert term is not None
    layers = term.inputs["offloaded_layers"]
    tokens = plan.strategy.batch_size * plan.strategy.seq_len
    per_step = 2 * layers * tokens * 4096 * 2 * plan.strategy.grad_accum  # bf16 T·H, down+up
    assert plan.risk.host_gb_per_step == pytest.approx(per_step / GB, rel=1e-9)
    copies_s = per_step / term.inputs["host_link_bytes_per_s"]
    assert plan.risk.streaming == pytest.approx(
        min(1.0, copies_s / plan.candidate.throughput.step_seconds) * 0.5, rel=1e-6)
    risks = next(line for line in plan.why if line.startswith("risks:"))
    assert (f"activation checkpoints offloaded to host RAM (Unsloth): "
            f"{plan.risk.host_gb_per_step:,.1f} GB per GPU per step over PCIe") in risks
