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


def test_the_shared_system_turn_is_computed_once_and_changes_no_answer(checkpoint, monkeypatch):
    import evaluation.checkpoint_simulator as module

    sim = load(checkpoint, max_new_tokens=6, temperature=0.0)
    shown = prompts()
    rows = sim.rows(shown)
    shared = module.shared_prefix_length(rows)
    # the three prompts differ after their system turn: the shared part is the whole system turn
    system_turn = sim.tokenizer.apply_chat_template([shown[0][0]], tokenize=False)
    assert sim.tokenizer.decode(rows[0][:shared]).startswith(system_turn.rstrip())
    ids, mask, cache = sim.with_shared_prefix(rows, shared)
    for row, laid_out, kept in zip(rows, ids.tolist(), mask.tolist(), strict=True):
        assert [t for t, m in zip(laid_out, kept, strict=True) if m] == row  # every token, in order
        assert laid_out[:shared] == row[:shared] and all(kept[:shared])
    assert cache.get_seq_length() == shared and len(sim._prefix[0]) == shared
    shared_answers = sim.act(shown)
    monkeypatch.setattr(module, "MIN_SHARED_TOKENS", 10**9)  # every batch left-padded instead
    assert sim.act(shown) == shared_answers == [sim.act([p])[0] for p in shown]
    # the logits of the first answer token agree too, within float rounding
    with torch.inference_mode():
        alone = sim.model(input_ids=torch.tensor([rows[1]])).logits[0, -1]
        ids, mask, cache = sim.with_shared_prefix(rows, shared)
        tail = sim.model(input_ids=ids[:, shared:], attention_mask=mask, **{sim.cache_argument: cache},
                         position_ids=(mask.cumsum(-1) - 1)[:, shared:]).logits[1, -1]  # fmt: skip
    torch.testing.assert_close(tail, alone, atol=1e-5, rtol=1e-4)


def test_sampling_is_reproducible_with_its_seed(checkpoint):
    first = load(checkpoint, max_new_tokens=6, seed=7).act(prompts())
    assert load(checkpoint, max_new_tokens=6, seed=7).act(prompts()) == first


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a model folder"):
        load(tmp_path)


class Uniform:
    """A row's stream that yields the given uniforms."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def test_a_row_is_drawn_from_the_top_p_nucleus_by_its_own_uniform(checkpoint):
    sim = load(checkpoint, temperature=1.0, top_p=0.6)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    # mass before each token, most likely first: 0, 0.5, 0.8; those below 0.6 stay, 0.5 and 0.3,
    # renormalised 0.625 and 0.375: a uniform below 0.625 picks the likeliest, above it the second
    picks = [sim.next_tokens(logits, [Uniform(u), Uniform(u)]).tolist() for u in (0.1, 0.6, 0.7, 0.99)]
    assert picks == [[0, 2], [0, 2], [1, 1], [1, 1]]
    assert load(checkpoint, temperature=0.0).next_tokens(logits, []).tolist() == [0, 2]


def nucleus_draw(logits, temperature, top_p, uniforms):
    """The reference: each row's whole vocabulary sorted in float64, the smallest prefix whose mass
    reaches top_p kept and renormalised, the token whose cumulative mass first exceeds the uniform."""
    picks = []
    for row, u in zip(logits.double(), uniforms, strict=True):
        probs = torch.softmax(row / temperature, dim=-1)
        ordered, order = probs.sort(descending=True, stable=True)
        before = torch.cat([ordered.new_zeros(1), ordered.cumsum(0)[:-1]])
        kept = ordered[before < top_p]
        cdf = (kept / kept.sum()).cumsum(0)
        picks.append(int(order[min(int((cdf <= u).sum()), len(kept) - 1)]))
    return picks


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])  # nuclei wider than the candidates, about as wide, narrow
def test_the_nucleus_is_drawn_as_from_the_whole_sorted_vocabulary(checkpoint, scale):
    import evaluation.checkpoint_simulator as module

    sim = load(checkpoint, temperature=0.9, top_p=0.95)
    generator = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(12, 600, generator=generator) * scale
    uniforms = torch.rand(12, generator=generator).tolist()
    picks = sim.next_tokens(logits, [Uniform(u) for u in uniforms]).tolist()
    assert picks == nucleus_draw(logits, 0.9, 0.95, uniforms)
    widest = max(int((torch.softmax(r / 0.9, -1).sort(descending=True)[0].cumsum(0) < 0.95).sum()) + 1
                 for r in logits)  # fmt: skip
    # the candidates alone serve where every row's nucleus fits among them, the sort otherwise
    shortcut = widest <= module.NUCLEUS_CANDIDATES
    _ordered, order, _before = sim.most_likely_first(torch.softmax(logits / 0.9, dim=-1))
    assert order.shape[-1] == (module.NUCLEUS_CANDIDATES + 1 if shortcut else 600)


def test_greedy_decoding_equals_generate(checkpoint):
    sim = load(checkpoint, max_new_tokens=6, temperature=0.0)
    row = sim.rows(prompts()[:1])[0]
    with torch.inference_mode():
        out = sim.model.generate(input_ids=torch.tensor([row]), max_new_tokens=6, do_sample=False,
                                 pad_token_id=sim.tokenizer.pad_token_id)  # fmt: skip
    assert sim.act(prompts()[:1]) == sim.tokenizer.batch_decode(out[:, len(row) :], skip_special_tokens=True)


def test_a_sampled_answer_depends_on_its_key_alone(checkpoint, monkeypatch):
    import evaluation.checkpoint_simulator as module

    sim = load(checkpoint, max_new_tokens=8)
    shown, keys = prompts(), [("s0", 0), ("s1", 3), ("s2", 1)]
    together = sim.act(shown, keys)
    # alone, in another order, in a batch of two, or left-padded without the shared system turn
    assert together == [sim.act([p], [k])[0] for p, k in zip(shown, keys, strict=True)]
    assert sim.act(shown[::-1], keys[::-1]) == together[::-1]
    assert load(checkpoint, max_new_tokens=8, max_batch=2).act(shown, keys) == together
    monkeypatch.setattr(module, "MIN_SHARED_TOKENS", 10**9)
    assert sim.act(shown, keys) == together
    # another step of the same sessions, or another seed, draws anew
    assert sim.act(shown, [(s, step + 1) for s, step in keys]) != together
    assert load(checkpoint, max_new_tokens=8, seed=7).act(shown, keys) != together
