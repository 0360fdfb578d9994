"""The operator's vLLM command line, read by vLLM's own argument parser (in the vLLM venv).

The builder writes vLLM flags and the schema refuses engine arguments that would set the
operator's; the two never meet except here, where vLLM 0.32's parser reads both: the example's
command line lands in the settings it means, and every refused argument really would have
overridden an operator-set flag (vLLM accepts abbreviations and `_` for `-`).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from inference_operator.builders import Owner
from inference_operator.builders.common import engine_port
from inference_operator.builders.deployment import service_values, shared_pod
from inference_operator.builders.storage import MODEL_DIR
from inference_operator.engines.vllm import DRAIN_SECONDS, vllm_args
from inference_operator.models import SpecError, parse_spec
from tests.llm.conftest import vllm_python
from testsupport.crd import ROOT

pytestmark = [pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "llm-vllm-8gpu.yaml"
# Each parses, in vLLM, to a setting the operator owns.
OVERRIDING = ["--serv=x", "--max_model_len=5", "--por=1", "--ho=::", "--tensor-parallel=2", "--model=/x", "--uds=/s"]
OPERATOR_DESTS = ["model", "served_model_name", "tensor_parallel_size", "max_model_len", "host", "port", "uds"]

PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

command_line, probes, dests = json.load(sys.stdin)
parser = make_arg_parser(FlexibleArgumentParser())
defaults = parser.parse_args([])
parsed = vars(parser.parse_args(command_line))
changed = {}
for probe in probes:
    values = vars(parser.parse_args([probe]))
    changed[probe] = [d for d in dests if values[d] != getattr(defaults, d)]
json.dump({"parsed": {k: v for k, v in parsed.items() if isinstance(v, (str, int, float, bool, list, type(None)))},
           "changed": changed}, sys.stdout)
"""


def test_vllm_reads_the_operators_command_line_and_the_refused_args_would_override_it() -> None:
    python = vllm_python()
    doc = yaml.safe_load(EXAMPLE.read_text())
    owner = Owner(name=doc["metadata"]["name"], namespace="ml", uid="u", spec=parse_spec(doc["spec"]))
    command_line = vllm_args(service_values(owner), shared_pod(owner))
    result = subprocess.run(
        [str(python), "-c", PARSE],
        input=json.dumps([command_line, OVERRIDING, OPERATOR_DESTS]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout)
    parsed = answer["parsed"]
    assert parsed["model"] == MODEL_DIR
    assert parsed["served_model_name"] == ["llama-3.3-70b-instruct"]
    assert parsed["tensor_parallel_size"] == 8
    assert parsed["max_model_len"] == 32768
    # On the pod's loopback, behind the front (which holds runtime.port).
    assert (parsed["host"], parsed["port"]) == ("127.0.0.1", engine_port(owner.spec))
    # At SIGTERM it finishes what it generates (its default, 0, aborts it).
    assert parsed["shutdown_timeout"] == DRAIN_SECONDS > 0
    # The example's engine arguments reach the engine.
    assert parsed["max_num_seqs"] == 256
    assert parsed["gpu_memory_utilization"] == pytest.approx(0.92)
    assert parsed["enable_prefix_caching"] is True

    for probe, changed in answer["changed"].items():
        assert changed, f"{probe} sets none of the operator's flags in vLLM: the schema need not refuse it"
        spec = {**doc["spec"], "runtime": {**doc["spec"]["runtime"], "args": [probe]}}
        with pytest.raises(SpecError):
            parse_spec(spec)
