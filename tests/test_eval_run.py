"""`validate eval` end to end through real bwrap: a real pool (its smoke test from the installed
wheel) passes; an eval contract freezes only on it; the heuristic baseline behind the real
local server is evaluated (greedy pass@1, then k samples); each endpoint fault lands in its
class with honest denominators; resume plays only what is missing; report, audit and
compare check out, and tampering is caught."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.deshuffle.baseline import MODEL_NAME, policy as baseline
from tests.conftest import CORPUS_PATH
from validate import api
from validate.core.errors import ContractError, ValidateError
from validate.core.paths import RunPaths
from validate.devtools.localserver import Faults, serve
from validate.evidence.journal import write_checksums

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]
DATA = (CORPUS_PATH,)
K = 2


@pytest.fixture(scope="module")
def server():
    with serve({MODEL_NAME: baseline}) as s:
        yield s


def freeze(pool_run, server, tmp_path, name="e", k=K, **options):
    sampling = {key: options.pop(key) for key in ("temperature", "seed") if key in options}
    return api.eval_freeze(name, pool_run=pool_run, model=MODEL_NAME, model_revision="test",
                           base_url=server.base_url, server="localserver", k=k, sampling=sampling,
                           limits=options, data=DATA, allow_patch=True, out=tmp_path / f"{name}.json")


def run(tmp_path, name="e", passes=("greedy", "sampled"), **kw):
    return api.eval_run(tmp_path / f"{name}.json", passes=passes, run_dir=tmp_path / f"run-{name}",
                        concurrency=4, data=DATA, allow_patch=True, **kw)


def test_freeze_refuses_anything_but_a_passed_audited_pool(passed_pool, server, tmp_path):
    c = freeze(passed_pool, server, tmp_path)
    assert c.parent.dataset_verdict == "PASS" and c.parent.task_count == 5 and c.k == K
    assert (
        c.parent.manifest_sha256 == json.loads((passed_pool / "frozen-manifest.json").read_text())["sha256"]
    )
    assert "api_key" not in c.model.model_dump() and c.model.api_key_env is None
    # a pool whose smoke test never ran: INCOMPLETE, not PASS
    summary = json.loads((passed_pool / "run.json").read_text())
    copy = tmp_path / "incomplete"
    shutil.copytree(passed_pool, copy, symlinks=True)
    shutil.rmtree(copy / "smoke")
    summary["facts"]["smoke"] = "not run"
    (copy / "run.json").write_text(json.dumps(summary))
    with pytest.raises(ContractError, match="dataset verdict is INCOMPLETE, not PASS"):
        freeze(copy, server, tmp_path)
    # a file slipped in after sealing: the audit fails
    tampered = tmp_path / "tampered"
    shutil.copytree(passed_pool, tampered, symlinks=True)
    (tampered / "notes.txt").write_text("added later")
    with pytest.raises(ContractError, match="validate audit .* failed: .*notes.txt: present but not listed"):
        freeze(tampered, server, tmp_path)
    with pytest.raises(ContractError, match="froze no set"):
        freeze(tmp_path, server, tmp_path)


def test_the_baseline_eval_greedy_then_sampled_with_report_and_audit(passed_pool, server, tmp_path):
    freeze(passed_pool, server, tmp_path, temperature=1.0)
    s = run(tmp_path)
    assert s.greedy.tasks == 5 and s.greedy.valid == 5 and s.greedy.lost == {}
    assert s.sampled.eligible == 5 and s.sampled.samples_lost == {}
    assert s.attempts == 5 * (1 + K) and s.superseded == 0
    assert 0.3 < s.greedy.mean_reward.value < 1.0  # a heuristic: clearly above chance, never the oracle
    ops = s.operations["eval"]
    assert ops.tool_calls == 5 * K and ops.malformed_tool_calls == 0 and ops.terminations == {"answer": 5 * K}
    assert ops.turns.mean == 2.0 and ops.prompt_tokens.n == 5 * K
    root = tmp_path / "run-e"
    turns = pq.read_table(root / "trajectories.parquet").to_pylist()
    assert len(turns) == 2 * 5 * (1 + K)
    call = turns[0]["tool_calls"][0] if turns[0]["turn"] == 0 else turns[1]["tool_calls"][0]
    assert call["name"] == "bash" and call["exit_code"] == 0 and call["output_bytes"] > 1000
    samples = pq.read_table(root / "samples.parquet").to_pylist()
    assert {(r["failure_class"], r["failure_rule"]) for r in samples if not r["solved"]} <= {
        ("capability", "wrong-answer")}
    entry = api.eval_report(root)
    html = (entry / "report.html").read_text()
    assert "pass@1 (greedy, temperature 0)" in html and html.count('class="msg tool"') >= 1
    assert api.eval_audit(root).problems == []


def _faulty(pool_run, server, tmp_path, name, faults: Faults, **limits):
    freeze(pool_run, server, tmp_path, name=name, endpoint_retries=1, retry_max_wait_s=0.1, **limits)
    server.set_faults(faults)
    try:
        return run(tmp_path, name=name, passes=("greedy",))
    finally:
        server.set_faults(Faults())


@pytest.mark.parametrize("faults,limits,kind", [
    (Faults(rate_limit_first_n=10**6, retry_after_s=0), {}, "rate_limited"),
    (Faults(server_error_first_n=10**6, server_error_status=502), {}, "server_error"),
    (Faults(truncate_first_n=10**6), {}, "truncated"),
    (Faults(delay_s=3.0), {"request_timeout_s": 0.3}, "timeout"),
])
def test_an_endpoint_that_stays_down_is_infrastructure_never_the_models_failure(passed_pool, server, tmp_path,
                                                                                 faults, limits, kind):
    s = _faulty(passed_pool, server, tmp_path, f"down-{kind}", faults, **limits)
    assert s.greedy.valid == 0 and s.greedy.lost == {"lost to infrastructure after its retries": 5}
    assert s.greedy.pass_at_1.denominator == 0 and s.greedy.pass_at_1_all.denominator == 5
    assert {(c.failure_class, c.rule)
            for c in s.failure_classes} == {("infrastructure", "infrastructure-error")}
    infra = [e for e in s.errors if e.status == "infrastructure_error"]
    assert infra and sum(e.attempts for e in infra) == 5 * 3  # every task, every try (infra_retries=2)
    rows = pq.read_table(tmp_path / f"run-down-{kind}" / "attempts.parquet").to_pylist()
    assert all(kind in r["error_message"] for r in rows)


def test_an_endpoint_hung_past_the_attempts_deadline_is_infrastructure_and_its_wait_is_kept(passed_pool,
                                                                                            server, tmp_path):
    # The reviewer's reproduction: every request hangs 5 s, a request times out after 1 s, the
    # attempt after 2 s. The second try of the request is cut by the deadline; that wait was
    # scored as the model's timeout (class capability, rule timeout-in-tools on 0 >= 0) and
    # its time was in neither model_s nor endpoint_wait_s.
    s = _faulty(passed_pool, server, tmp_path, "hung", Faults(delay_s=5.0), request_timeout_s=1.0,
                attempt_timeout_s=2.0)
    assert s.greedy.valid == 0 and s.greedy.lost == {"lost to infrastructure after its retries": 5}
    assert {(c.failure_class, c.rule)
            for c in s.failure_classes} == {("infrastructure", "infrastructure-error")}
    assert s.operations["eval-greedy"].timeout_terminations == 0
    samples = pq.read_table(tmp_path / "run-hung" / "samples.parquet").to_pylist()
    assert len(samples) == 5 * 3  # every task, every try (infra_retries=2)
    for row in samples:
        assert row["termination"] is None and row["model_s"] == 0.0 and row["tool_s"] == 0.0
        # both tries: the first's full 1 s and the second's, cut by the deadline (the clock
        # started with the sandbox)
        assert (
            1.0 < row["endpoint_wait_s"] <= row["wall_s"] and row["endpoint_wait_s"] + row["sandbox_s"] > 1.9
        ), row
        assert row["endpoint_tries"] == 2 and row["failure_rule"] == "infrastructure-error"
    assert api.eval_audit(tmp_path / "run-hung").problems == []


def test_a_rate_limit_inside_the_retries_costs_time_not_the_sample(passed_pool, server, tmp_path):
    s = _faulty(passed_pool, server, tmp_path, "429", Faults(rate_limit_first_n=3, retry_after_s=1))
    assert s.greedy.valid == 5 and s.errors == []
    turns = pq.read_table(tmp_path / "run-429" / "trajectories.parquet").to_pylist()
    assert sum(len(t["faults"]) for t in turns) == 3 and all(f == "rate_limited" for t in turns
                                                             for f in t["faults"])


def test_connection_refused_is_refused_by_the_preflight_not_written_as_infrastructure(passed_pool, server,
                                                                                      tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api.eval_freeze("refused", pool_run=passed_pool, model=MODEL_NAME, model_revision="test",
                    base_url=f"http://127.0.0.1:{port}/v1", server="nothing", k=K,
                    limits={"endpoint_retries": 0}, data=DATA, allow_patch=True,
                    out=tmp_path / "refused.json")
    with pytest.raises(ValidateError, match=r"model.base_url: nothing answers at .* \(connection refused\)"):
        run(tmp_path, name="refused", passes=("greedy",))
    # tests/test_eval_preflight.py has the other broken endpoints
    assert not (tmp_path / "run-refused").exists()


def test_malformed_tool_calls_are_the_models_own_and_counted(passed_pool, server, tmp_path):
    s = _faulty(passed_pool, server, tmp_path, "malformed", Faults(malformed_tool_args_first_n=10**6))
    ops = s.operations["eval-greedy"]
    assert s.greedy.valid == 5 and ops.malformed_tool_calls == 5 and ops.tool_calls == 5
    assert ops.tool_failures == 0 and s.errors == []
    assert {c.failure_class for c in s.failure_classes} == {"capability"}  # it answered anyway, unread


def test_resume_plays_only_what_is_missing(passed_pool, server, tmp_path):
    freeze(passed_pool, server, tmp_path, name="r")
    first = run(tmp_path, name="r", passes=("greedy",))
    assert first.attempts == 5
    before = len(server.requests)
    again = api.eval_run(None, resume=tmp_path / "run-r", concurrency=4, data=DATA, allow_patch=True)
    assert again.attempts == 5 * (1 + K) and again.greedy == first.greedy
    # not the preflight's
    chats = [r for r in server.requests[before:] if r.path.endswith("/chat/completions")]
    assert len(chats) == 2 * 5 * K  # two requests per sampled attempt, none for the greedy ones
    assert api.eval_audit(tmp_path / "run-r").problems == []
    # attempts/s over the attempts' own span, not over the resuming session's alone
    a = pq.read_table(tmp_path / "run-r" / "attempts.parquet").to_pandas()
    span = (a["finished_at"].max() - a["started_at"].min()).total_seconds()
    assert span > (again.finished_at - again.started_at).total_seconds()
    md = (api.eval_report(tmp_path / "run-r") / "report.md").read_text()
    assert f"{span:.0f} s of wall time, {again.attempts / span:.2f} attempts/s." in md


def test_compare_lists_what_varied_and_refuses_another_dataset_or_k(passed_pool, server, tmp_path):
    for name, temperature in (("a", 0.7), ("b", 1.0)):
        freeze(passed_pool, server, tmp_path, name=name, temperature=temperature)
        run(tmp_path, name=name)
    result, entry = api.compare(tmp_path / "run-a", tmp_path / "run-b", out=tmp_path / "cmp")
    assert [v[0] for v in result.varied] == ["sampling.temperature"]
    assert result.overall[0][3] == "+0.0000"  # the greedy pass is deterministic: the same under both
    assert len(result.tasks) == 5 and (entry / "compare.html").is_file()
    freeze(passed_pool, server, tmp_path, name="k3", k=3)
    run(tmp_path, name="k3", passes=("sampled",))
    with pytest.raises(ValidateError, match="differ in k "):
        api.compare(tmp_path / "run-a", tmp_path / "run-k3", out=tmp_path / "cmp")


def test_audit_catches_a_reclassified_failure(passed_pool, server, tmp_path):
    freeze(passed_pool, server, tmp_path, name="t")
    root = tmp_path / "run-t"
    run(tmp_path, name="t", passes=("greedy",))
    assert api.eval_audit(root).problems == []
    table = pq.read_table(root / "samples.parquet")
    classes = ["uncertain"] * table.num_rows
    table = table.set_column(table.schema.get_field_index("failure_class"), "failure_class",
                             pa.array(classes, type=pa.string()))
    pq.write_table(table, root / "samples.parquet")
    write_checksums(RunPaths(root))  # re-sealed, as a forger would
    problems = api.eval_audit(root).problems
    assert any("do not follow from its status" in p for p in problems)
    assert any("eval.json: does not recompute" in p for p in problems)


def test_the_command_line(passed_pool, server, tmp_path):
    import subprocess

    from tests.conftest import VALIDATE, subprocess_env

    def cli(*args):
        return subprocess.run([*VALIDATE, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env=subprocess_env())

    common = ["--pool-run", str(passed_pool), "--model", MODEL_NAME, "--model-revision", "test", "--base-url",
              server.base_url, "--server", "localserver", "--data", str(CORPUS_PATH), "--allow-patch"]
    r = cli("eval", "freeze", "--name", "cli", *common, "-k", "2", "--temperature", "0.5", "--max-turns", "4")
    assert r.returncode == 0 and "froze eval cli" in r.stdout, r.stderr
    assert json.loads((tmp_path / "manifests/cli.json").read_text())["limits"]["max_turns"] == 4
    r = cli("eval", "run", "--contract", "manifests/cli.json", "--run-dir", "ledgers/cli", "--passes",
            "greedy", "--data", str(CORPUS_PATH), "--allow-patch")
    assert r.returncode == 0 and r.stdout.startswith("pass@1 (greedy, temperature 0)"), r.stderr
    assert cli("eval", "report", "ledgers/cli").returncode == 0
    r = cli("eval", "audit", "ledgers/cli")
    assert r.returncode == 0 and r.stdout.startswith("audit passed"), r.stdout
    r = cli("eval", "freeze", "--name", "bad", *common, "--temperature", "9")
    assert r.returncode == 2 and "--temperature" in r.stderr
    r = cli("eval", "freeze", "--name", "bad", *common[:1], str(tmp_path), *common[2:])
    assert r.returncode == 2 and "froze no set" in r.stderr
    r = cli("compare", "ledgers/cli", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not an eval run directory" in r.stderr
