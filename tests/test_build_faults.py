"""A build that fails for this machine's reasons is never the task's fault
(`validate.taskdir.images.netfault`), and builds can be given the host's trust store
(`validate.taskdir.images.trust`). Real tasks authored here whose Dockerfiles pip-install a small
package from PyPI, built by the suite's own dockerd on a machine whose egress intercepts TLS
(as this project's machines do); real probes from the build host."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from validate.cli.main import main
from validate.taskdir.images import netfault
from validate.taskdir.images.trust import TRUST_FILE, TRUST_PATH, TRUST_VARIABLES, with_trust

TASK_TOML = (
    '[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n[environment]\nbuild_timeout_sec = 300\n'
)
DOCKERFILES = {
    "pip-six": "FROM python:3.11-slim-bookworm\n"
               "RUN pip install --no-cache-dir six==1.16.0 && python -c 'import six'\n",
    "pip-typo": "FROM python:3.11-slim-bookworm\nRUN pip install --no-cache-dir no-such-package-zq9x==1.0\n",
    # a task that fakes the machine's fault in its own output
    "fake-tls": "FROM python:3.11-slim-bookworm\nRUN echo \"Could not fetch URL https://pypi.org/simple/x/: "
                "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed\" && exit 1\n",
}


def _dataset(root: Path) -> Path:
    for name, dockerfile in DOCKERFILES.items():
        task = root / name
        for sub in ("environment", "solution", "tests"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text(TASK_TOML)
        (task / "instruction.md").write_text("Write hello to /app/out.\n")
        (task / "environment/Dockerfile").write_text(dockerfile + "WORKDIR /app\n")
        (task / "solution/solve.sh").write_text("#!/bin/bash\necho hello > /app/out\n")
        (task / "tests/test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def test_log_errors_name_their_host_and_unconfirmed_claims_stay_the_tasks(monkeypatch):
    log = textwrap.dedent("""\
        WARNING: Retrying ... after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL:
        CERTIFICATE_VERIFY_FAILED] certificate verify failed'))': /simple/six/
        Could not fetch URL https://pypi.org/simple/six/: There was a problem confirming the ssl certificate: \
HTTPSConnectionPool(host='pypi.org', port=443): certificate verify failed
        curl: (6) Could not resolve host: nothing.invalid
        """)  # noqa: E501
    assert {(e.kind, e.host) for e in netfault.network_errors(log)} == {("tls", "pypi.org"),
                                                                        ("dns", "nothing.invalid")}
    assert netfault.classify("ERROR: No matching distribution found for six", "host") is None
    said = netfault.classify("curl: (6) Could not resolve host: nothing.invalid", "none")
    assert said[0] == "unsupported_execution_contract" and "builds without one" in said[1]
    # a name unknown everywhere is the task's typo; a public index's is this machine's egress
    assert netfault.classify("curl: (6) Could not resolve host: nothing.invalid", "host") is None
    monkeypatch.setattr(netfault, "PUBLIC_HOSTS", frozenset({"nothing.invalid"}))
    said = netfault.classify("curl: (6) Could not resolve host: nothing.invalid", "host")
    assert said[0] == "unsupported_execution_contract" and "does not resolve from this build host" in said[1]
    said = netfault.classify("curl: (7) Failed to connect to 127.0.0.1 port 443: Connection refused", "host")
    assert said[0] == "infrastructure_failure" and "cannot be reached" in said[1]


def test_the_trust_store_is_copied_after_every_from_as_build_arguments_only():
    text = "FROM a AS one\nRUN x\nFROM \\\n  b\nCOPY --from=one /x /x\n"
    out = with_trust(text)
    lines = out.splitlines()
    assert lines[:2] == ["FROM a AS one", f"COPY {TRUST_FILE} {TRUST_PATH}"] and "ENV" not in out
    assert out.count(f"COPY {TRUST_FILE}") == 2 and all(f"ARG {v}={TRUST_PATH}" in lines
                                                        for v in TRUST_VARIABLES)
    assert lines.index("  b") < lines.index(f"COPY {TRUST_FILE} {TRUST_PATH}", 3)  # after the continued FROM


@pytest.mark.docker
@pytest.mark.slow
def test_a_pip_build_behind_the_tls_proxy_is_the_machines_fault_and_builds_with_the_hosts_trust_store(
    tmp_path, capsys
):
    data = _dataset(tmp_path / "ds")
    args = ["freeze", "--env", "harbor", "--name", "pip", "--dataset", str(data), "--min-count", "1",
            "--allow-patch"]
    assert main([*args, "--out", str(tmp_path / "off.json")]) == 0
    off = json.loads((tmp_path / "off.json").read_bytes())["execution"]["task_images"]
    assert "trust_store" not in off["build_policy"]
    six = off["tasks"]["pip-six"]
    assert six["refusal"] == "infrastructure_failure" and "intercepts TLS" in six["detail"], six
    assert "--build-trust-store host" in six["detail"]
    # played, the frozen refusal is the machine's: infrastructure_failure, never the task's fault
    assert main(["run", "--manifest", str(tmp_path / "off.json"), "--run-dir", str(tmp_path / "run"), "-c",
                 "2", "--agents", "oracle", "--allow-patch"]) == 1
    import pandas as pd

    verdicts = pd.read_parquet(tmp_path / "run/tasks.parquet").set_index("task_id")
    assert verdicts.loc["pip-six", "reason"] == "infrastructure_failure", verdicts.loc["pip-six"].to_dict()
    assert main([*args, "--build-trust-store", "host", "--out", str(tmp_path / "host.json")]) == 0
    on = json.loads((tmp_path / "host.json").read_bytes())["execution"]["task_images"]
    assert on["build_policy"]["trust_store"].startswith("sha256:")
    assert on["tasks"]["pip-six"]["image"].startswith("sha256:"), on["tasks"]["pip-six"]
    for task in ("pip-typo", "fake-tls"):  # given the host's trust, a failure is the task's own
        assert on["tasks"][task]["refusal"] == "invalid_task_or_verifier", on["tasks"][task]
    import docker

    image = docker.from_env().images.get(on["tasks"]["pip-six"]["image"])
    assert not any(v.split("=")[0] in TRUST_VARIABLES for v in image.attrs["Config"]["Env"])
    capsys.readouterr()
