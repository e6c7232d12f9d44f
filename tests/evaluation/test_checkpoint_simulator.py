"""The ``checkpoint:`` simulator: a tiny randomly initialised Llama saved as a folder, end to end."""

from __future__ import annotations

import pytest

from evaluation.engine import roll_out, traces_manifest_path
from evaluation.rollout import Rollout
from evaluation.simulators import Sampling, simulator_for_lake
from evaluation.traces import read_traces
from tests.evaluation.test_environment import session
from tests.evaluation.tiny_model import save_tiny_llama

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(2)
    corpus = [m["content"] for offset in (0.0, 300.0) for m in Rollout(session(offset=offset)).messages()]
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), corpus)


def load(checkpoint, **sampling):
    return simulator_for_lake(f"checkpoint:{checkpoint}", checkpoint, Sampling(**sampling))


def prompts():
    return [Rollout(session(offset=offset)).messages() for offset in (0.0, 120.5, 300.0)]


def test_a_tiny_checkpoint_completes_rollouts_end_to_end(checkpoint, tmp_path):
    sim = load(checkpoint, max_new_tokens=8)
    path = tmp_path / "t.jsonl"
    sessions = [session(session_id=f"s{i}", offset=float(60 * i)) for i in range(4)]
    summary = roll_out(sessions, sim, path, source=f"checkpoint:{checkpoint}", batch_size=4)
    traces = read_traces(path)
    assert summary.written == 4 and len(traces) == 4
    # an untrained model writes no protocol JSON in 8 tokens: each episode's one output (max_try 1)
    # is rejected and the episode ends truncated
    assert {t.termination_reason for t in traces} == {"invalid_retry_exhausted"}
    assert {(len(t.steps), t.steps[0].accepted, t.steps[0].reject_reason) for t in traces} == {
        (1, False, "parse_failure")
    }
    assert all(t.steps[0].raw_output for t in traces)
    run = traces_manifest_path(path).read_text()
    assert '"max_new_tokens": 8' in run and '"top_p": 0.95' in run and '"seed": 42' in run


def test_a_batch_left_padded_answers_as_each_prompt_alone(checkpoint):
    sim = load(checkpoint, max_new_tokens=6, temperature=0.0)
    shown = prompts()
    lengths = {len(sim.tokenizer.apply_chat_template(p, tokenize=False)) for p in shown}
    assert len(lengths) == 3  # prompts of different lengths, so the batch is padded
    assert sim.act(shown) == [sim.act([p])[0] for p in shown]


def test_sampling_is_reproducible_with_its_seed(checkpoint):
    first = load(checkpoint, max_new_tokens=6, seed=7).act(prompts())
    assert load(checkpoint, max_new_tokens=6, seed=7).act(prompts()) == first


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a model folder"):
        load(tmp_path)
