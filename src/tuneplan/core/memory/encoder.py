"""Encoder-only models (BERT, RoBERTa) fine-tuned for sequence classification: what differs
from the decoder blocks of ``activations.py``, tensor by tensor.

Read off transformers 5.24 ``models/bert/modeling_bert.py`` (BertEmbeddings, BertSelfAttention
with ``eager_attention_forward``, BertSelfOutput, BertIntermediate, BertOutput, BertPooler,
BertForSequenceClassification) and ``models/roberta/modeling_roberta.py`` (RobertaEmbeddings,
RobertaClassificationHead), and held to the CPU simulation
(``tests/core/memory/test_simulation_encoder.py``). With T = B·S tokens, per block:

- post-LN: each of the two ``nn.LayerNorm`` saves its input (the residual sum, fp32 under
  autocast: an fp16/bf16 sublayer output plus the fp32 residual promotes) and fp32 mean and
  rstd; its output is the next sublayer's input and the residual it adds back, so no tensor
  besides the norm's output is held across a sublayer (``activations.forward_live``);
- eager attention: q, k (``q @ kᵀ``), the softmax output B·heads·S·S (no ``dtype=`` upcast:
  the compute dtype, fp32 under CUDA autocast, whose fp32 list holds softmax), the dropout
  mask (``attention_probs_dropout_prob``; bool on CUDA) and the dropout output ``attn @ v``
  saves (under autocast its compute-dtype cast instead), v, and the contiguous output (the
  ``dense`` input). No RoPE, no GQA, no causal mask;
- the two hidden dropouts (``hidden_dropout_prob``) after ``attention.output.dense`` and
  ``output.dense``: one T·H mask each;
- GELU (``hidden_act`` "gelu", exact erf GELU) saves its input T·I: ``activations.mlp_saved``.

Once per step: the embedding sum's LayerNorm and dropout mask, the gathered token-type ids
(BERT: 1·S int64; RoBERTa: its B·S position ids and B·S token types), and the head on the
first token: BERT's pooler ``dense`` reads ``hidden[:, 0]``, a view that keeps the whole last
hidden state T·H alive unless autocast casts it to a B·H copy; RoBERTa's head drops out the
first token first (a B·H copy). Then tanh's B·H output, the classifier dropout's B·H mask
and output, B·labels fp32 logits.
"""

from __future__ import annotations

from tuneplan.core.job.strategy import Strategy, Task
from tuneplan.core.memory.activations import Shape, Widths, encoder_dropout, norm_saved
from tuneplan.core.memory.parts import Piece, part
from tuneplan.core.models import ModelSpec

SOURCE = "transformers 5.24 models/bert/modeling_bert.py (BertEmbeddings, BertPooler)"


def hidden_dropout(model: ModelSpec) -> float:
    return encoder_dropout(model, "hidden_dropout_prob")


def classifier_dropout(model: ModelSpec) -> float:
    return encoder_dropout(model, "classifier_dropout")


def is_roberta(model: ModelSpec) -> bool:
    return model.model_type == "roberta"


def seq_cls_head_params(model: ModelSpec, labels: int) -> int:
    """*ForSequenceClassification's head in place of the MLM head: BERT's pooler dense (H·H+H)
    + classifier (H·labels+labels); RoBERTa's classification head dense + out_proj (same)."""
    h = model.hidden_size
    return h * h + h + h * labels + labels


def embedding_terms(model: ModelSpec, s: Strategy, w: Widths, shape: Shape) -> list[Piece]:
    """What the embeddings save for backward, alive until the bottom of backward."""
    t, h = shape.tokens, model.hidden_size
    ids = (2 * t * 8) if is_roberta(model) else shape.seq_q * 8
    mask = t * h * w.dropout_mask if hidden_dropout(model) > 0 else 0
    return [part("activations/embeddings", norm_saved(model, t, w) + mask + ids,
                 "embedding LayerNorm input T·H·bytes + mean/rstd 2·T·4 + dropout mask "
                 "T·H·mask bytes + gathered index tensors (int64)", SOURCE, tokens=t)]


def head_terms(model: ModelSpec, s: Strategy, w: Widths, shape: Shape) -> list[Piece]:
    """The sequence-classification head's saved tensors and logits (first token only)."""
    b, h = shape.batch, model.hidden_size
    c = w.compute
    out = w.compute if w.autocast else w.residual
    p = classifier_dropout(model)
    if not s.method.trains_base:
        first = 0                           # a frozen dense saves no input
    elif is_roberta(model) and p > 0:
        first = b * h * w.residual          # dropout(features[:, 0]): a B·H copy, its mask
        first += b * h * w.dropout_mask
    elif w.autocast:
        first = b * h * c                   # the dense's autocast cast of the first token
    else:
        first = shape.tokens * h * w.residual   # the view keeps the last hidden state alive
    tail = b * h * out                      # tanh output
    if p > 0:
        tail += b * h * (w.dropout_mask + out)   # dropout mask + output (classifier input)
    logits = b * s.num_labels * 4
    formula = ("head on the first token: dense input (a view keeping T·H, or B·H), tanh "
               "output, dropout mask and output B·H each, fp32 logits B·labels·4")
    return [part("activations/head_input", first + tail, formula, SOURCE, tokens=shape.tokens),
            part("logits/scores", logits, "B·labels·4", SOURCE)]


def task_problem(model: ModelSpec, s: Strategy) -> str | None:
    """Encoder-only models are modelled as sequence classifiers only."""
    if model.is_encoder_only and s.task is not Task.SEQ_CLS:
        return (f"{model.name} is an encoder-only {model.model_type} model: only --task seq-cls "
                "is modelled (it has no causal language-model head)")
    return None
