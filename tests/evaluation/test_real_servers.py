"""The evaluation against real models (slow): the ``openai:`` simulator over real HTTP against
``transformers serve`` serving a checkpoint the trainer wrote, and the untrained SmolLM2-135M-Instruct
as a ``checkpoint:`` row of the comparison table beside ``markov``.

Both run ``trajforge evaluate`` on a few sessions of one small synthetic lake, the lake the tiny
checkpoint is trained on: what a user does with a trained checkpoint, a vLLM fleet being the same API.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.app import app
from evaluation.checkpoint_simulator import CheckpointSimulator
from evaluation.rollout import Rollout
from evaluation.simulators import Sampling, derived_seed
from evaluation.traces import read_replay, read_traces
from extractors.config import ExtractSettings
from extractors.pipeline import extract_lake
from synthetic.bundle import write_bundle
from tests.evaluation.scripted_server import serving
from tests.evaluation.test_environment import session
from tests.evaluation.test_evaluate_cli import EFFECT, HEADLINE, SUPPLEMENTARY
from tests.trainer.test_sft_run import small as small_sft
from trainer.pretrained import served
from trainer.run import run_sft
from transforms.ingest import ingest_bundle
from transforms.records import write_records

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SESSIONS = 3
SMOLLM2_SESSIONS = 2  # 11 recorded steps, each a prompt of ~1,100 tokens to a 135M model on 2 cores
# a key the server must receive and nothing the evaluation writes or prints may hold
API_KEY = "sk-test-never-written-3f9c"
CHAT = "/v1/chat/completions"
SERVED_200 = f'"POST {CHAT} HTTP/1.1" 200'  # uvicorn's access-log line for one answered request


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """12 synthetic shoppers through ingest, records, offline extraction (rationales) and records again."""
    root = tmp_path_factory.mktemp("real-servers")
    write_bundle(root / "raw", users=12, seed=9, fmt="parquet", parts_per_table=1)
    ingest_bundle(root / "raw", root / "lake")
    write_records(root / "lake", modes=["single"])
    extract_lake(root / "lake", ExtractSettings(progress=False, cache=False))
    write_records(root / "lake", modes=["single"])
    return root / "lake"


@pytest.fixture(scope="module")
def trained_checkpoint(lake, tmp_path_factory) -> Path:
    """A tiny model trained by the trainer for a few updates and written by its checkpoint writer."""
    torch.set_num_threads(2)
    settings = small_sft(steps=6, eval_split="val")
    return Path(run_sft(settings, lake, tmp_path_factory.mktemp("sft"), progress=False).checkpoint)


@dataclass(frozen=True)
class Exchange:
    """One request as it passed on its way to the server, and the server's answer."""

    path: str
    authorization: str | None
    request: dict[str, Any]
    status: int
    response: dict[str, Any]

    @property
    def content(self) -> str:
        return self.response["choices"][0]["message"]["content"]


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, list[Exchange]]]:
    """A pass-through HTTP server in front of ``upstream`` (a ``/v1`` base URL) that keeps every request
    and answer; yields its own ``/v1`` base URL and the list it appends to."""
    root = upstream.removesuffix("/v1")
    exchanges: list[Exchange] = []

    class Forward(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the evaluation's check of the endpoint (its models): passed on
            self.relay(*self.forward(urllib.request.Request(root + self.path, method="GET")))

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            forwarded = urllib.request.Request(
                root + self.path, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            status, payload = self.forward(forwarded)
            auth = self.headers.get("Authorization")
            exchanges.append(Exchange(self.path, auth, json.loads(body), status, json.loads(payload)))
            self.relay(status, payload)

        @staticmethod
        def forward(request: urllib.request.Request) -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(request, timeout=600) as answer:
                    return answer.status, answer.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        def relay(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:  # the server's own log is the one read
            pass

    with serving(Forward) as base_url:
        yield base_url, exchanges


def evaluate(lake: Path, out: Path, specs: list[str], max_new_tokens: int, sessions: int = SESSIONS) -> Any:
    args = ["evaluate", "--lake", str(lake), "--out", str(out), "--sessions", str(sessions), "--no-effect"]
    args += ["--max-new-tokens", str(max_new_tokens)]
    for spec in specs:
        args += ["--simulator", spec]
    return CliRunner().invoke(app, args, env={"OPENAI_API_KEY": API_KEY})


def validity(rollout: Path, replayed: Path) -> tuple[float, float]:
    """(RVA, OVA) worked out from the trace files (PROTOCOL.md §4, L0): accepted replay predictions over
    all scored replay outputs, accepted rollout outputs over all rollout outputs."""
    scored = [row for row in read_replay(replayed) if row.unscored_reason is None]
    steps = [step for trace in read_traces(rollout) for step in trace.steps]
    return sum(r.accepted for r in scored) / len(scored), sum(s.accepted for s in steps) / len(steps)


def assert_every_session_ended(rollout: Path, spec: str, sessions: int = SESSIONS) -> None:
    traces = read_traces(rollout)
    assert len(traces) == sessions and {t.source for t in traces} == {spec}
    # ended by the protocol (a terminal action, the budget, max_try), never by a failed request
    for trace in traces:
        assert (trace.terminated or trace.truncated) and trace.termination_reason not in (None, "error")
        # every step kept its answer; an empty one (end-of-sequence sampled first) is an answer too
        assert trace.steps and all(isinstance(step.raw_output, str) for step in trace.steps)


@pytest.mark.timeout(1800)  # a tiny model: 1 min on a quiet machine, several on a crowded one
def test_openai_simulator_against_transformers_serve(prefect_harness, lake, trained_checkpoint, tmp_path):
    generation = json.loads((trained_checkpoint / "generation_config.json").read_text())
    assert (generation["do_sample"], generation["top_k"]) == (True, 0)  # what the served requests sample
    log = tmp_path / "transformers-serve.log"
    max_tokens = 16
    with served(trained_checkpoint, log=log) as server, recording_proxy(server) as (base_url, exchanges):
        spec = f"openai:{trained_checkpoint}@{base_url}"
        result = evaluate(lake, tmp_path / "eval", [spec], max_tokens)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    figures = report["simulators"][spec]
    assert list(report["simulators"]) == [spec] and list(figures) == HEADLINE + SUPPLEMENTARY + EFFECT
    assert [figures[key] for key in EFFECT] == [None] * len(EFFECT)  # --no-effect
    rollout, replayed = (Path(report["traces"][spec][kind]) for kind in ("rollout", "replay"))
    assert_every_session_ended(rollout, spec)

    # every answer the evaluation kept is one the server sent, and every one it sent was kept: the
    # rollout's steps and the replay's scored rows, one request each (none failed, none retried)
    kept = [s.raw_output for t in read_traces(rollout) for s in t.steps]
    kept += [r.raw_output for r in read_replay(replayed) if r.unscored_reason is None]
    # an empty answer is one the server can send (a sampled end-of-sequence first): it is kept as sent
    assert any(kept) and sorted(kept) == sorted(e.content for e in exchanges)
    # the server sampled as it was asked (temperature 1.0), because the checkpoint's generation config
    # samples: decoded greedily, this barely trained model answers the same few tokens to every prompt
    assert len(set(kept)) > 1
    runs = report["runs"][spec]
    assert len(exchanges) == runs["rollout"]["outputs"] + runs["replay"]["outputs"] == len(kept)
    # ... and they reached the server itself: its access log has one answered request for each
    assert log.read_text().count(SERVED_200) == len(exchanges)
    assert {(e.path, e.status) for e in exchanges} == {(CHAT, 200)}

    # the requests: the served folder as the model, PROTOCOL.md §3 sampling, no constrained decoding,
    # the system prompt then the rendered observation
    sessions = {t.session_id for t in read_traces(rollout)}
    request_seeds = {derived_seed(42, s, step, bits=31) for s in sessions for step in range(64)}
    for e in exchanges:
        assert e.request["model"] == str(trained_checkpoint) and "response_format" not in e.request
        assert (e.request["temperature"], e.request["top_p"]) == (1.0, 0.95)
        assert e.request["seed"] in request_seeds  # seed 42's, derived per prompt's session and step
        assert e.request["max_tokens"] == max_tokens
        assert [m["role"] for m in e.request["messages"]] == ["system", "user"]
        assert "## Current observation" in e.request["messages"][1]["content"]
    # the key travels with every request and is written nowhere: not printed, logged or in a file
    assert {e.authorization for e in exchanges} == {f"Bearer {API_KEY}"}
    assert API_KEY not in result.output and API_KEY not in log.read_text()
    assert not [p for p in (tmp_path / "eval").iterdir() if API_KEY in p.read_text()]

    assert (figures["RVA"], figures["OVA"]) == pytest.approx(validity(rollout, replayed))


def table_row(cells: list[str]) -> str:
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def printed(key: str, value: float | None) -> str:
    """A figure as Table 2 prints it: 4 decimals, TE 2, a dash where there is none."""
    if value is None:
        return "–"
    return f"{value:.2f}" if key == "TE" else f"{value:.4f}"


@pytest.mark.timeout(2400)  # under a minute on 2 quiet cores, about 10 on a crowded machine
def test_untrained_smollm2_is_a_checkpoint_row_of_table_2(prefect_harness, lake, smollm2_folder, tmp_path):
    torch.set_num_threads(2)
    smollm2 = f"checkpoint:{smollm2_folder}"
    result = evaluate(
        lake, tmp_path / "eval", [smollm2, "markov"], max_new_tokens=24, sessions=SMOLLM2_SESSIONS
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert list(report["simulators"]) == [smollm2, "markov"]
    figures = report["simulators"][smollm2]
    assert list(figures) == HEADLINE + SUPPLEMENTARY + EFFECT
    rollout, replayed = (Path(report["traces"][smollm2][kind]) for kind in ("rollout", "replay"))
    assert_every_session_ended(rollout, smollm2, SMOLLM2_SESSIONS)
    rva, ova = validity(rollout, replayed)
    assert (figures["RVA"], figures["OVA"]) == pytest.approx((rva, ova))
    # markov only ever chooses executable actions; a general-purpose model without training writes
    # prose, code fences and cut-off JSON in 24 tokens, so most of its outputs are rejected
    markov = report["simulators"]["markov"]
    assert (markov["RVA"], markov["OVA"]) == (1.0, 1.0) and ova < 1.0 and rva < 1.0

    page = (tmp_path / "eval" / "report.html").read_text()
    for spec in (smollm2, "markov"):
        row = [spec, *(printed(key, report["simulators"][spec][key]) for key in HEADLINE)]
        assert table_row(row) in page


@pytest.mark.timeout(1200)
def test_the_checkpoint_simulator_prompts_smollm2_in_its_own_chat_format(smollm2_folder):
    torch.set_num_threads(2)
    sim = CheckpointSimulator.from_spec(str(smollm2_folder), Sampling(max_new_tokens=8, temperature=0.0))
    prompts = [Rollout(session(offset=offset)).messages() for offset in (0.0, 120.5)]
    batch = sim.encode(prompts)
    # SmolLM2's ChatML, written out by hand: no begin-of-text token, each turn closed by <|im_end|>
    for messages, ids, mask in zip(prompts, batch["input_ids"], batch["attention_mask"], strict=True):
        system, user = (m["content"] for m in messages)
        chatml = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        assert sim.tokenizer.decode(ids[mask.bool()], clean_up_tokenization_spaces=False) == chatml
    # the shorter prompt is padded on the left, with the end-of-turn token SmolLM2 declares as its pad
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    shorter, pads = lengths.index(min(lengths)), max(lengths) - min(lengths)
    assert pads > 0 and sim.tokenizer.pad_token == "<|im_end|>"
    mask, ids = batch["attention_mask"][shorter], batch["input_ids"][shorter]
    assert mask[:pads].sum() == 0 and mask[pads:].all()
    assert set(ids[:pads].tolist()) == {sim.tokenizer.pad_token_id}
    # greedy answers of the padded batch are each prompt's answer alone
    assert sim.act(prompts) == [sim.act([p])[0] for p in prompts]
