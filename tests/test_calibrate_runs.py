"""`batchlab calibrate --from`: the step model fitted to the steps a worker executed recovers that worker's model."""
import json

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.lab.simulate import simulate_run
from batchlab.protocol.settings import RunConfig
from batchlab.worker.stepmodel import StepModel, get_preset, save_preset

runner = CliRunner()
TERMS = ("overhead_s", "decode_s_per_row", "decode_s_per_context_token", "prefill_overhead_s",
         "prefill_s_per_token", "prefill_s_per_row", "prefill_s_per_token_pair")
# every compute-form term non-zero, so each one must be found (ms-scale, like tiny-mistral on a CPU)
KNOWN = StepModel("known", 2e8, 16384, 0.0, 2e-5, 0.004, 8e9, 0.0006, 2e-6, 0.0008, 3e-8, 0.006)


def _runs(tmp_path, model: StepModel, strategies: tuple[str, ...], duration_s: float = 6.0):
    preset = tmp_path / "known.yaml"
    save_preset(model, preset)
    for strategy in strategies:
        cfg = RunConfig(strategy=strategy, backend="sim", preset=str(preset), rate=5.0, duration_s=duration_s,
                        dataset="synthetic", max_new_tokens=32, max_batch_size=8, out=str(tmp_path / "runs" / strategy))
        simulate_run(cfg.validate())
    return tmp_path / "runs"


def _calibrate(*args: str):
    return runner.invoke(app, ["calibrate", *args])


@pytest.mark.parametrize("layout", [dict(padded=True, fused=True), dict(padded=False, fused=False)],
                         ids=["hf-like padded and fused", "vllm-like packed"])
@pytest.mark.slow
def test_the_fit_recovers_every_term_of_the_model_that_made_the_runs(tmp_path, layout):
    from dataclasses import replace

    model = replace(KNOWN, **layout)
    runs = _runs(tmp_path, model, ("dynamic", "continuous"))
    out = tmp_path / "fit.yaml"
    result = _calibrate("--from", str(runs), "--out", str(out))
    assert result.exit_code == 0, result.output
    fitted = get_preset(str(out))
    for term in TERMS:
        assert getattr(fitted, term) == pytest.approx(getattr(model, term), rel=0.01), term
    assert (fitted.padded, fitted.fused) == (model.padded, model.fused)
    assert fitted.decode_rows_factor == ()  # the terms draw every row count: no factor
    record = yaml.safe_load(out.read_text())["calibration"]
    assert record["held_out_error"]["decode"]["worst_abs"] < 0.01 and abs(record["total_time_error"]) < 0.01
    assert {"decode", "prefill"} <= set(record["held_out_error"]) and len(record["from_runs"]) == 2


@pytest.mark.slow
def test_a_row_count_the_terms_cannot_draw_gets_its_own_factor_and_the_others_none(tmp_path):
    """vLLM on the 2-core CPU: decode steps of 1 and 2 rows take longer than 4 (lab.calibrate_runs.row_factors)."""
    from dataclasses import replace

    from batchlab.simulator.replay import predict_steps
    from batchlab.worker.run_steps import read_run_steps

    model = replace(KNOWN, padded=False, fused=True, decode_rows_factor=(1.4, 1.5))
    runs = _runs(tmp_path, model, ("continuous",))
    out = tmp_path / "fit.yaml"
    result = _calibrate("--from", str(runs), "--out", str(out))
    assert result.exit_code == 0, result.output
    fitted = get_preset(str(out))
    steps = read_run_steps(runs / "continuous", padded=False, fused=True).steps
    alone = steps[steps["prefill_tokens"] == 0]
    terms_alone, worst = replace(fitted, decode_rows_factor=()), 0.0
    for rows, own in alone.groupby("decode_rows"):
        if len(own) >= 5:  # each row count's decode steps alone, priced as the playing model priced them
            playing = predict_steps(model, own).sum()
            assert predict_steps(fitted, own).sum() / playing == pytest.approx(1.0, abs=0.01), (rows, len(own))
            worst = max(worst, abs(predict_steps(terms_alone, own).sum() / playing - 1))
    assert worst > 0.1  # which the terms alone cannot do (16% short on 2 rows, 14% long on 3 here)
    mixed = steps[(steps["prefill_tokens"] > 0) & (steps["decode_rows"] > 0)]  # the decodes beside a prompt
    assert predict_steps(fitted, mixed).sum() == pytest.approx(predict_steps(model, mixed).sum(), rel=0.02)
    print(f"fitted row factors {fitted.decode_rows_factor} from {len(alone)} decode steps alone")


def test_a_fused_fit_is_chosen_by_its_error_as_the_simulator_prices_it():
    """make run's busy vLLM runs: a prompt alone took 47 ms for 30 tokens, one beside 7 decodes 20 ms over them. Both
    fused fits came out sharing the larger overhead, and the one with the smaller residual as fitted priced every
    mixed step with a 27 ms overhead it never fitted (40% long: the twin's TTFT p50 53% off)."""
    from batchlab.lab.calibrate import Constants
    from batchlab.lab.calibrate_runs import fit_runs
    from batchlab.simulator.replay import predict_steps

    rows = []  # executed steps: 10 ms + 1 ms a row decoding; a prompt 0.5 ms a token, 30 ms more when alone
    for i in range(40):
        rows.append(dict(decode_rows=8, decode_context=8 * (60 + i), prefill_rows=0, prefill_tokens=0, seconds=0.018))
    for tokens in (4, 8, 16, 32, 64, 128, 256):
        for decoding in (1, 4, 7):
            rows += [dict(decode_rows=decoding, decode_context=decoding * 60, prefill_rows=1, prefill_tokens=tokens,
                          seconds=0.010 + 0.001 * decoding + 0.0005 * tokens)] * 3
        rows.append(dict(decode_rows=0, decode_context=0, prefill_rows=1, prefill_tokens=tokens,
                         seconds=0.040 + 0.0005 * tokens))
    steps = pd.DataFrame(rows)
    steps = steps.assign(prefill_pairs=steps["prefill_tokens"] ** 2, start_s=0.0, end_s=steps["seconds"])
    model, table = fit_runs(steps, "busy", "compute", Constants(fused=True))
    mixed = table[table["kind"] == "mixed"]
    priced = predict_steps(model, mixed) / mixed["seconds"] - 1  # as the simulator plays it
    assert (priced.abs() < 0.25).all() and priced.abs().median() < 0.1, priced.describe()


def test_runs_of_several_backends_are_refused_unless_one_is_chosen(tmp_path):
    runs = _runs(tmp_path, KNOWN, ("dynamic", "continuous"), duration_s=3.0)
    summary = runs / "continuous" / "summary.json"
    body = json.loads(summary.read_text())
    body["settings"]["workers"]["worker-0"]["backend"] = "vllm"
    summary.write_text(json.dumps(body))
    result = _calibrate("--from", str(runs), "--out", str(tmp_path / "x.yaml"))
    assert result.exit_code == 1 and "these runs ran on sim, vllm" in result.output and "--kind" in result.output
    result = _calibrate("--from", str(runs), "--kind", "sim", "--out", str(tmp_path / "x.yaml"))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((tmp_path / "x.yaml").read_text())["calibration"]["from_runs"] == [str(runs / "dynamic")]


def test_a_folder_without_runs_is_one_line_and_exit_1(tmp_path):
    result = _calibrate("--from", str(tmp_path), "--out", str(tmp_path / "x.yaml"))
    assert result.exit_code == 1 and "no run folder (summary.json)" in result.output
    assert "Traceback" not in result.output


def _tokens_without_batch_id(run):
    tokens = pd.read_parquet(run / "tokens.parquet")
    tokens.drop(columns=["batch_id"]).to_parquet(run / "tokens.parquet")


def _tokens_with_text_times(run):
    tokens = pd.read_parquet(run / "tokens.parquet")
    tokens.assign(time=tokens["time"].astype(str)).to_parquet(run / "tokens.parquet")


def _worker_entry_a_string(run):
    body = json.loads((run / "summary.json").read_text())
    body["settings"]["workers"] = {"worker-0": "a worker"}
    (run / "summary.json").write_text(json.dumps(body))


@pytest.mark.parametrize("spoil, bad_file, says", [
    (_tokens_without_batch_id, "tokens.parquet", "lacks the column batch_id"),
    (_tokens_with_text_times, "tokens.parquet", "has columns of the wrong kind: time (str, not number)"),
    (_worker_entry_a_string, "summary.json", "settings.workers' entry is str, not an object"),
], ids=["tokens without batch_id", "token times as text", "a worker entry that is a string"])
def test_a_run_whose_tables_or_worker_facts_are_not_a_runs_is_one_line_and_exit_1(tmp_path, spoil, bad_file, says):
    run = _runs(tmp_path, KNOWN, ("dynamic",), duration_s=3.0) / "dynamic"
    spoil(run)
    result = _calibrate("--from", str(run), "--out", str(tmp_path / "x.yaml"))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {run / bad_file}: ") and says in lines[0], lines
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.slow
def test_a_live_sim_workers_steps_give_back_its_model(tmp_path, continuous_preset_run):
    """Real processes and clocks: the fitted model prices the run's own steps like the model that played them,
    within the worker's dispatch and sleep slack (a few ms a step, always late). The session's shared run:
    continuous at 4 req/s for 6 s, 24 new tokens, every term of its model non-zero."""
    from batchlab.simulator.replay import predict_steps
    from batchlab.worker.run_steps import read_run_steps

    run, preset = continuous_preset_run
    model = get_preset(str(preset))
    out = tmp_path / "fit.yaml"
    result = _calibrate("--from", str(run), "--out", str(out))
    assert result.exit_code == 0, result.output
    record = yaml.safe_load(out.read_text())["calibration"]
    # The fit keeps the steps' measured total to the same 5% as below (ratio ÷ late is 1 + this error): it
    # minimises each shape's relative error, not the total, and a loaded machine spreads the slack (0.0326 seen)
    assert abs(record["total_time_error"]) < 0.05
    steps = read_run_steps(run, padded=False).steps
    playing = predict_steps(model, steps).sum()
    ratio = predict_steps(get_preset(str(out)), steps).sum() / playing
    # The worker's slack is the run's own (a loaded machine makes every sleep later): the fitted model prices
    # the steps as they were measured, which is the playing model plus that slack, never faster than it.
    # (A shape read too small from the tables is caught in virtual time, where the terms come back exactly.)
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    early = measured < predict_steps(model, steps) - 0.002
    late = measured.sum() / playing
    print(f"fitted ÷ playing model over {len(steps)} steps: {ratio:.3f}; measured ÷ playing: {late:.3f}")
    assert early.mean() < 0.01  # a step's sleep never ends early: no shape is read too large
    assert 0.97 < ratio and ratio == pytest.approx(late, rel=0.05)


@pytest.mark.slow
def test_weighing_shapes_by_their_time_share_recovers_the_terms_too(tmp_path):
    runs = _runs(tmp_path, KNOWN, ("dynamic", "continuous"), duration_s=4.0)
    out = tmp_path / "fit.yaml"
    result = _calibrate("--from", str(runs), "--weigh", "time", "--out", str(out))
    assert result.exit_code == 0, result.output
    fitted = get_preset(str(out))
    for term in TERMS:
        assert getattr(fitted, term) == pytest.approx(getattr(KNOWN, term), rel=0.01), term
    assert yaml.safe_load(out.read_text())["calibration"]["weigh"] == "time"
    bad = _calibrate("--from", str(runs), "--weigh", "tokens", "--out", str(tmp_path / "x.yaml"))
    assert bad.exit_code == 1 and "--weigh must be one of steps, time" in bad.output


def test_the_fit_keeps_the_workers_step_budget_and_skips_a_sweeps_probes(tmp_path):
    """A continuous worker that chunks its prompts at a budget (here a sim worker whose preset says 48
    tokens a step) gives a preset with that budget, so the simulator chunks as the worker did; the runs
    under a sweep's _capacity and _probe folders are searches, not points, and are left out."""
    from dataclasses import replace

    runs = _runs(tmp_path, replace(KNOWN, step_tokens=48), ("continuous",), duration_s=3.0)
    for probe in ("_capacity/sweep_label=continuous", "_probe/x"):
        (runs / probe).mkdir(parents=True)
        (runs / probe / "summary.json").write_text("{not json: reading it would fail the fit")
    out = tmp_path / "fit.yaml"
    result = _calibrate("--from", str(runs), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert get_preset(str(out)).step_tokens == 48
    assert yaml.safe_load(out.read_text())["calibration"]["from_runs"] == [str(runs / "continuous")]


def test_a_step_that_records_no_prefill_tokens_prefills_its_joiners_whole_prompts():
    """vLLM's worker counted no prompt tokens in its steps before it did: a step whose rows yield their
    first tokens then prefilled those rows' whole prompts, so the fit sees prefill work, not a free step."""
    import pandas as pd

    from batchlab.worker.run_steps import executed_steps

    requests = pd.DataFrame({"request_id": [0, 1], "prompt_len": [30, 50], "scheduled_time": [0.0, 0.0]})
    batches = pd.DataFrame({"batch_id": [0, 1], "worker": ["w", "w"]})
    tokens = pd.DataFrame({"request_id": [0, 1, 0, 1], "token_index": [0, 0, 1, 1], "token_id": [1, 1, 1, 1],
                           "time": [0.1, 0.1, 0.2, 0.2], "batch_id": [0, 1, 0, 1]})
    for recorded, want in ((0, 80.0), (80, 80.0), (40, 40.0)):  # none recorded; whole; a chunk
        steps = pd.DataFrame({"worker": ["w", "w"], "step": [0, 1], "start_time": [0.0, 0.1],
                              "end_time": [0.1, 0.2], "prefill_tokens": [recorded, 0]})
        frame = executed_steps(requests, batches, tokens, steps, padded=False).steps
        assert frame["prefill_tokens"].tolist() == [want, 0.0]
        assert frame["decode_rows"].tolist() == [0, 2] and frame["decode_context"].tolist() == [0.0, 82.0]


def test_several_folders_follow_one_from(tmp_path):
    """`--from A B`, as --help shows the option, fits both folders' runs (not 'unexpected extra argument')."""
    runs = _runs(tmp_path, KNOWN, ("dynamic", "continuous"), duration_s=3.0)
    out = tmp_path / "both.yaml"
    result = _calibrate("--from", str(runs / "dynamic"), str(runs / "continuous"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["calibration"]["from_runs"] == [str(runs / "dynamic"),
                                                                           str(runs / "continuous")]


def test_a_padded_workers_prompt_chunks_are_read_as_the_simulator_times_them(tmp_path):
    """The HF loop pads a prefill-only step's prompt chunks to the longest (its slot cache's prefill forward): a
    step that prefilled a few short prompts whole and a long one's first chunk computed rows × the longest chunk,
    not the step's recorded tokens; beside decodes it packs them. Its record says its chunks (protocol 7:
    prefill_rows, prefill_width, prefill_pairs) and the reader counts them as the simulator does, so a simulated
    run's own steps replay to their own times."""
    import numpy as np

    from batchlab.lab.simulate import simulate_run
    from batchlab.lab.sweep_plan import Point, load_plan
    from batchlab.simulator.replay import predict_steps
    from batchlab.worker.run_steps import read_run_steps
    from batchlab.worker.stepmodel import get_preset

    config = tmp_path / "loop.yaml"
    config.write_text("base: {backend: sim, preset: cpu-tiny-mistral-loop, dataset: synthetic, prompt_lengths: 8-250, "
                      "output_lengths: 8, max_new_tokens: 8, max_batch_size: 8, duration_s: 3, warmup_requests: 0}\n"
                      "grid: {strategies: [{strategy: continuous, label: continuous}], rates: [1]}\n")
    plan = load_plan(config)
    point = Point(plan.entries[0], float("inf"), 0, plan.seed, tmp_path / "run", 16)  # 16 closed-loop clients:
    simulate_run(point.config({**plan.base, "num_requests": 80}))  # rows that joined together finish together
    model = get_preset("cpu-tiny-mistral-loop")
    steps = read_run_steps(point.folder, model.padded, model.fused).steps
    chunked = steps[(steps["prefill_rows"] >= 2) & (steps["decode_rows"] == 0)]
    assert len(chunked), "no prefill-only step of several rows: the case this test is about did not happen"
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    np.testing.assert_allclose(predict_steps(model, steps), measured, rtol=1e-6)
