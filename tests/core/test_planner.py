"""The planner on small hand-built catalogs: scenario expectations, ranking, caching, fit."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from tuneplan.adapters.bundled import load_gpu_specs, load_providers
from tuneplan.adapters.hub import resolve_model
from tuneplan.adapters.importers.snapshot import load_bundled_snapshot
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Job, Objective, Offload, Optimizer, Precision, Strategy
from tuneplan.core.memory import MemoryEstimate
from tuneplan.core.planner.fit import fit
from tuneplan.core.planner.plan import PlanResult, pareto_front, plan_offers
from tuneplan.core.planner.search import StrategySearch, largest_fitting
from tuneplan.errors import InvalidValueError
from tuneplan.units import GiB

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
SPECS = {s.name: s for s in load_gpu_specs()}
PROVIDERS = {p.name: p for p in load_providers()}


def offer(gpu: str, count: int, price: str, *, provider: str = "RunPod", spot: str | None = None,
          interconnect: str | None = None, ram_gib: int = 2048, name: str = "") -> Offer:
    return Offer(provider=provider, instance_type=name or f"{count}x-{gpu}", gpu=gpu,
                 gpu_count=count, gpu_memory_bytes=SPECS[gpu].memory_bytes, vcpus=32,
                 ram_bytes=ram_gib * GiB, region="us-east", price_per_hour=Decimal(price),
                 spot_price_per_hour=None if spot is None else Decimal(spot),
                 interconnect=interconnect, fetched_at=NOW, source="test")


def run(model: str, method: str, offers: list[Offer], **job: object) -> PlanResult:
    spec = resolve_model(model)
    settings = {"tokens": 50_000_000} | job
    strategy = settings.pop("strategy", Strategy(method=Method(method)))
    return plan_offers(spec, Job(model=model, strategy=strategy, **settings),  # type: ignore[arg-type]
                       offers, SPECS, PROVIDERS, now=NOW)


MIXED = [
    offer("T4", 1, "0.35"), offer("L4", 1, "0.80"), offer("RTX 4090", 1, "0.69"),
    offer("L40S", 1, "1.20"), offer("A100 80GB SXM4", 1, "1.90"), offer("H100 SXM5", 1, "2.99"),
    offer("H100 SXM5", 8, "23.92", interconnect="NVLink 4.0"),
    offer("A100 80GB SXM4", 8, "14.00", interconnect="NVLink 3.0"),
]


def test_8b_qlora_picks_a_single_mid_range_card() -> None:
    # Over the real bundled catalog and its prices, not a toy one:
    # on toy prices an H100 and an L40S can come within the model's own uncertainty.
    offers = [o for _, result, _ in load_bundled_snapshot() for o in result.offers]
    result = run("meta-llama/Llama-3.1-8B", "qlora", offers)
    best = result.plans[0]
    assert best.offer.gpu_count == 1
    assert 24 * GiB <= best.capacity_bytes <= 48 * GiB   # a 24-48 GB card, not an H100/A100
    assert best.strategy.method is Method.QLORA
    assert best.candidate.device_total_bytes <= best.capacity_bytes * 0.95


def test_70b_full_needs_a_multi_gpu_node_and_prefers_nvswitch_at_equal_price() -> None:
    # Pure bf16 with 8-bit AdamW (6 B/param) shards onto 8 x 80 GB without offload, so the
    # link matters (with offload, CPU Adam hides it).
    lean = Strategy(method=Method.FULL, precision=Precision.BF16, optimizer=Optimizer.ADAMW8BIT)
    sxm = offer("A100 80GB SXM4", 8, "16.00", interconnect="NVLink 3.0", name="sxm")
    pcie = offer("A100 80GB PCIe", 8, "16.00", name="pcie")
    result = run("meta-llama/Llama-3.1-70B", "full", [*MIXED[:6], sxm, pcie], strategy=lean)
    assert result.plans and all(p.strategy.world_size > 1 for p in result.plans)
    order = [p.offer.instance_type for p in result.plans]
    assert order.index("sxm") < order.index("pcie")
    by_name = {p.offer.instance_type: p for p in result.plans}
    assert by_name["sxm"].link == "nvswitch" and by_name["pcie"].link == "pcie"
    assert by_name["pcie"].hours > by_name["sxm"].hours
    assert any("PCIe-only node" in w for w in by_name["pcie"].warnings)
    single = [r for r in result.rejected if r.offer.gpu_count == 1]
    assert single and all("GiB" in r.reason or "no BF16" in r.reason for r in single)
    assert any(r.reason.startswith("needs ") for r in single)


@pytest.mark.parametrize("objective", [Objective.COST, Objective.PARETO])
def test_a_half_billion_model_never_recommends_8x_h100(objective: Objective) -> None:
    result = run("Qwen/Qwen2.5-0.5B", "lora", MIXED, objective=objective)
    assert result.plans[0].offer.gpu_count == 1
    eight_h100 = [p for p in result.plans if p.offer.gpu_count == 8 and p.gpu.name == "H100 SXM5"]
    assert eight_h100 and eight_h100[0].id not in result.pareto_ids   # 7 minutes for 4x cost
    assert eight_h100[0] not in result.plans[:3]


def test_a_tight_deadline_flips_the_ranking_toward_faster_nodes() -> None:
    loose = run("meta-llama/Llama-3.1-8B", "lora", MIXED, tokens=300_000_000)
    fastest = min(p.hours for p in loose.plans)
    tight = run("meta-llama/Llama-3.1-8B", "lora", MIXED, tokens=300_000_000,
                deadline_s=fastest * 3600 * 1.5)
    assert tight.plans[0].hours < loose.plans[0].hours
    assert tight.plans[0].offer.id != loose.plans[0].offer.id
    assert all(p.hours * 3600 <= fastest * 3600 * 1.5 for p in tight.plans)
    assert any("deadline" in r.reason for r in tight.rejected)


def test_no_spot_removes_spot_prices_and_spot_can_win_when_allowed() -> None:
    cheap_spot = [offer("L40S", 1, "1.20", spot="0.30", provider="AWS")]
    shown = run("meta-llama/Llama-3.1-8B", "qlora", cheap_spot)
    assert shown.plans[0].spot_usd is not None and not shown.plans[0].uses_spot
    allowed = run("meta-llama/Llama-3.1-8B", "qlora", cheap_spot, spot=True)
    assert allowed.plans[0].uses_spot and allowed.plans[0].best_cost < allowed.plans[0].cost_usd
    none = run("meta-llama/Llama-3.1-8B", "qlora", cheap_spot, spot=False)
    assert none.plans[0].spot_usd is None and none.plans[0].spot is None


def test_budget_rejects_expensive_plans_with_the_reason() -> None:
    result = run("meta-llama/Llama-3.1-8B", "lora", MIXED, budget_usd=Decimal("3"))
    assert all(p.best_cost <= 3 for p in result.plans)
    assert any(r.reason.startswith("costs $") for r in result.rejected)


def test_auto_tries_methods_and_says_the_trade_off() -> None:
    result = run("meta-llama/Llama-3.1-8B", "auto", MIXED)
    methods = {p.strategy.method for p in result.plans}
    assert Method.FULL in methods and Method.LORA in methods
    assert any("LoRA" in line for line in result.plans[0].why)


def test_plan_ids_are_stable_and_depend_on_the_strategy() -> None:
    first = run("meta-llama/Llama-3.1-8B", "qlora", MIXED[:3])
    again = run("meta-llama/Llama-3.1-8B", "qlora", MIXED[:3])
    assert [p.id for p in first.plans] == [p.id for p in again.plans]
    other = run("meta-llama/Llama-3.1-8B", "lora", MIXED[:3])
    assert {p.id for p in first.plans}.isdisjoint({p.id for p in other.plans})


def test_memory_is_cached_by_strategy_not_per_offer() -> None:
    one = run("meta-llama/Llama-3.1-8B", "lora", [offer("L40S", 1, "1.20")])
    many = run("meta-llama/Llama-3.1-8B", "lora", [
        offer("L40S", 1, str(1 + i / 100), provider=p, name=f"n{i}")
        for i, p in enumerate(["RunPod", "AWS", "GCP", "Lambda"] * 5)])
    assert len(many.plans) == 20
    assert many.memory_estimates == one.memory_estimates


def test_pareto_front_holds_no_dominated_plan() -> None:
    result = run("meta-llama/Llama-3.1-8B", "lora", MIXED, objective=Objective.PARETO)
    front = pareto_front(result.plans, result.assumptions.min_pareto_saving_s)
    assert [p.id for p in front] == list(result.pareto_ids)
    for p in front:
        assert not any(q.best_cost <= p.best_cost and q.hours < p.hours for q in result.plans)
    assert [p.id for p in result.plans[:len(front)]] == list(result.pareto_ids)


def test_a_card_without_bf16_runs_fp16_and_says_so() -> None:
    result = run("Qwen/Qwen2.5-0.5B", "lora", [offer("T4", 1, "0.35")])
    plan = result.plans[0]
    assert plan.strategy.precision.value == "fp16-mixed"
    assert any("no BF16" in w for w in plan.warnings)


def test_largest_fitting_is_a_bisection() -> None:
    calls: list[int] = []

    def fits(n: int) -> bool:
        calls.append(n)
        return n <= 37

    assert largest_fitting(fits, 1, 1000) == 37
    assert len(calls) <= 12     # log2(1000) + 2, not a linear scan
    assert largest_fitting(lambda n: False, 1, 10) == 0


@pytest.mark.parametrize("gpu", ["H100 SXM5", "A100 80GB SXM4", "V100 SXM2 16GB", "L40S"])
def test_generation_shift_of_a_neutral_estimate_matches_the_exact_one(gpu: str) -> None:
    search = StrategySearch(model=resolve_model("meta-llama/Llama-3.2-1B"),
                            base=Strategy(method=Method.LORA, batch_size=2), tokens=None,
                            epochs=1)
    neutral = search.memory(search.base, None)
    exact = search.memory(search.base, SPECS[gpu].generation)
    assert isinstance(neutral, MemoryEstimate) and isinstance(exact, MemoryEstimate)
    assert search.device_total(neutral, SPECS[gpu].generation) == exact.device_total_bytes


def test_fit_finds_limits_and_changes_that_fit() -> None:
    search = StrategySearch(model=resolve_model("meta-llama/Llama-3.1-8B"),
                            base=Strategy(method=Method.FULL), tokens=None, epochs=1)
    report = fit(search, SPECS["A100 80GB SXM4"])
    assert not report.fits
    by_method = {m.method: m for m in report.methods}
    # QLoRA saves weight memory but, after prepare_model_for_kbit_training, keeps norms in fp32
    # (larger activations), so at the limit its micro-batch can be LoRA's or one less.
    assert by_method[Method.QLORA].largest_batch >= by_method[Method.LORA].largest_batch - 1 >= 1
    assert by_method[Method.QLORA].peak_bytes < by_method[Method.LORA].peak_bytes
    assert by_method[Method.FULL].largest_batch == 0
    changes = {s.change.split(" (")[0].split(":")[0]: s for s in report.suggestions}
    assert "QLoRA" in changes and any(c.startswith("ZeRO-3 over") for c in changes)
    assert all(s.fits and s.peak_bytes <= report.limit_bytes for s in report.suggestions)


def test_job_validates_every_problem_at_once() -> None:
    with pytest.raises(InvalidValueError, match=r"epochs.*budget"):
        Job(model="x", epochs=0, budget_usd=Decimal(-1))
    job = Job(model="x", dataset_rows=1000, avg_tokens=500)
    assert job.tokens_per_epoch == 500_000
    with pytest.raises(InvalidValueError, match="not both"):  # rows would go unused
        replace(job, tokens=7)


def test_multi_node_when_one_node_cannot_hold_the_job() -> None:
    # 70B full (fp32 AdamW, 16 B/param) on 8 x 80 GB needs offload; with 64 GiB of host RAM
    # offload is impossible, so one node is rejected and, when allowed, nodes are added.
    node = offer("A100 80GB SXM4", 8, "32.77", provider="AWS", interconnect="NVLink 3.0",
                 ram_gib=64)
    alone = run("meta-llama/Llama-3.1-70B", "full", [node], multi_node=False)
    assert not alone.plans and "host RAM" in alone.rejected[0].reason
    spread = run("meta-llama/Llama-3.1-70B", "full", [node], multi_node=True)
    # the default (no --multi-node, no --no-multi-node) spreads a whole node that cannot hold
    # the job too, onto the same nodes
    default = run("meta-llama/Llama-3.1-70B", "full", [node])
    assert [p.strategy.nodes for p in default.plans] == [p.strategy.nodes for p in spread.plans]
    best = spread.plans[0]
    assert best.strategy.nodes >= 2 and best.strategy.offload.value == "none"
    floor = Decimal("32.77") * best.strategy.nodes * Decimal(str(best.hours)) * Decimal("0.99")
    assert best.cost_usd is not None and best.cost_usd >= floor   # every node is billed


def test_pure_bf16_is_refused_on_a_card_without_bf16() -> None:
    bf16 = Strategy(method=Method.LORA, precision=Precision.BF16, recipe=Recipe.TORCHTUNE)
    result = run("Qwen/Qwen2.5-0.5B", "lora", [offer("T4", 1, "0.35")], strategy=bf16)
    assert not result.plans and result.rejected[0].reason.startswith("no BF16 on T4")


def test_a_gpu_priced_without_its_host_is_rejected_with_its_reason() -> None:
    attachable = replace(offer("L4", 1, "0.20", provider="GCP", name="gpu-only"), attachable=True)
    result = run("Qwen/Qwen2.5-0.5B", "lora", [attachable, offer("L4", 1, "0.80")])
    assert [p.offer.instance_type for p in result.plans] == ["1x-L4"]
    (rejection,) = [r for r in result.rejected if r.offer.instance_type == "gpu-only"]
    assert "without its host VM" in rejection.reason


def test_strategy_and_job_read_back_from_their_dicts_and_refuse_bad_keys() -> None:
    import json
    from decimal import Decimal

    import pytest

    from tuneplan.core.job.methods import Method
    from tuneplan.core.job.strategy import Job, Sharding, Strategy
    from tuneplan.errors import InvalidValueError

    s = Strategy(method=Method.QLORA, gpus=8, sharding=Sharding.ZERO3, lora_targets=("q_proj",))
    job = Job(model="m", strategy=s, tokens=5_000, budget_usd=Decimal("12.50"),
              providers=("aws",), spot=True)
    plain = json.loads(json.dumps(job.as_dict(), default=str))
    assert Strategy.from_dict(plain["strategy"]) == s
    assert Job.from_dict(plain) == job
    with pytest.raises(InvalidValueError) as err:
        Strategy.from_dict(plain["strategy"] | {"gpus": 0})
    assert "gpus must be at least 1" in str(err.value)
    with pytest.raises(InvalidValueError) as err:
        Strategy.from_dict({"batch_size": "4", "colour": "red", "packing": "yes"})
    assert all(w in str(err.value) for w in ("batch_size", "colour", "packing"))
    with pytest.raises(InvalidValueError, match="tokens_per_epoch"):
        Job.from_dict(plain | {"tokens_per_epoch": 7})


def test_an_offer_record_reads_back_and_an_edited_one_is_refused() -> None:
    import json
    from datetime import UTC, datetime
    from decimal import Decimal

    import pytest

    from tuneplan.core.catalog.offers import Offer, offer_from_record, offer_record
    from tuneplan.errors import InvalidValueError

    offer = Offer(provider="AWS", instance_type="p5.48xlarge", gpu="H100 SXM5", gpu_count=8,
                  gpu_memory_bytes=80 * 2**30, vcpus=192.0, ram_bytes=2 * 2**40, region="us-east-1",
                  price_per_hour=Decimal("98.32"), spot_price_per_hour=Decimal("30.1"),
                  fetched_at=datetime(2026, 11, 30, tzinfo=UTC), source="test")
    plain = json.loads(json.dumps(offer_record(offer), default=str))
    assert offer_from_record(plain) == offer
    with pytest.raises(InvalidValueError, match=r"offer\.id="):
        offer_from_record(plain | {"region": "eu-west-1"})  # the id no longer matches
    with pytest.raises(InvalidValueError, match=r"unknown key offer\.discount"):
        offer_from_record(plain | {"discount": "0.5"})


@pytest.mark.parametrize(("gpu", "count", "stated", "link"), [
    ("RTX 3090", 2, None, "pcie"),               # a bridge is optional: not assumed
    ("RTX 3090", 2, "NVLink bridge", "nvlink"),  # the offer says so
    ("RTX A6000", 4, "NVLink bridge", "pcie"),   # a bridge joins pairs only
    ("H100 PCIe", 2, None, "pcie"),
    ("H100 SXM5", 8, None, "nvswitch"),          # SXM baseboards carry NVLink/NVSwitch
    ("H100 SXM5", 8, "PCIe", "pcie"),            # unless the offer says otherwise
    ("H100 SXM5", 1, None, "single"),
])
def test_a_node_is_nvlinked_only_when_the_offer_or_the_board_says_so(
        gpu: str, count: int, stated: str | None, link: str) -> None:
    from tuneplan.core.planner.costing import node_link
    assert node_link(offer(gpu, count, "1", interconnect=stated), SPECS[gpu]) == link


def test_two_rtx_3090_without_a_bridge_pay_pcie_all_reduce_time() -> None:
    # Short steps (128 tokens a step per GPU): the gradient all-reduce cannot hide behind them.
    job = Strategy(method=Method.FULL, seq_len=128, batch_size=1, gpus=2)
    fixed = ("batch_size", "gpus")  # as --batch-size 1 --gpus 2 give them
    bare = run("Qwen/Qwen2.5-0.5B", "full", [offer("RTX 3090", 2, "0.50")],
               strategy=job, fixed=fixed).plans[0]
    bridged = run("Qwen/Qwen2.5-0.5B", "full",
                  [offer("RTX 3090", 2, "0.50", interconnect="NVLink bridge")],
                  strategy=job, fixed=fixed).plans[0]
    assert bare.strategy.gpus == bridged.strategy.gpus == 2
    bare_comm = bare.candidate.throughput.comm_seconds_per_step
    assert bare_comm > bridged.candidate.throughput.comm_seconds_per_step > 0
    assert bare.hours > bridged.hours
    # the bare pair's all-reduce runs over PCIe through the host, the bridged one's over NVLink
    fabric = {name: plan.candidate.throughput.step.get("step/communication-exposed")
              for name, plan in (("bare", bare), ("bridged", bridged))}
    assert {name: term.inputs["fabric"] for name, term in fabric.items() if term} == {
        "bare": "pcie", "bridged": "nvlink"}


def test_the_cpu_optimizer_step_follows_the_offers_vcpus() -> None:
    node = offer("A100 80GB SXM4", 8, "15.00", interconnect="NVLink 3.0")
    few, many = (run("meta-llama/Llama-3.1-70B", "full", [replace(node, vcpus=n)],
                     fixed=("optimizer",)).plans[0]
                 for n in (16, 256))
    # 70B full state (~1.1 TB) exceeds 8 x 80 GB: the optimizer steps on the host's cores.
    assert few.strategy.offload is not Offload.NONE is not many.strategy.offload
    host = "step/optimizer-offloaded"
    assert few.candidate.throughput.step.get(host).value > (
        many.candidate.throughput.step.get(host).value)
    assert few.hours > many.hours
