"""Speculative decoding, unit by unit: the n-gram index, the auto-off gate, the cache's
continuation look-up, the KVManager's discard of rejected slots, and the acceptance rules
(greedy, and rejection sampling checked by chi-square against the target distribution,
where deliberately broken rules must fail the same test)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.chi2 import goodness_of_fit
from tests.helpers.kv_helpers import T, make_kv
from radixserve.mem_cache.continuation import continuation
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.req import Req
from radixserve.speculative.gate import AcceptanceGate
from radixserve.speculative.ngram import NgramIndex
from radixserve.speculative.verify import greedy_accept, rejection_accept, sample_from


# ---------------------------------------------------------------- n-gram index
def test_ngram_proposes_what_followed_the_latest_match():
    idx = NgramIndex(min_n=2, max_n=4)
    idx.sync([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert idx.propose(3) == [4, 5, 9]  # "1 2 3" occurred before, followed by 4 5 9
    idx.sync([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 2, 3])
    assert idx.propose(2) == [7, 8]  # the most recent "2 3" wins (longest suffix "8 2 3" unseen)
    assert idx.propose(10) == [7, 8, 2, 3]  # never past the end
    idx.sync([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 2, 3, 6])
    assert idx.propose(3) == []  # "3 6" and "6" never occurred before (1-grams are not used)


def test_ngram_index_reindexes_a_rewritten_sequence():
    idx = NgramIndex()
    idx.sync([1, 2, 3, 1, 2])
    assert idx.propose(1) == [3]
    idx.sync([5, 6, 5])  # not an extension: indexed anew
    assert idx.tokens == [5, 6, 5] and idx.propose(2) == []
    idx.sync([5, 6, 5, 6])
    assert idx.propose(2) == [5, 6]


# ---------------------------------------------------------------- auto-off
def test_gate_pauses_on_low_acceptance_and_reopens():
    g = AcceptanceGate(threshold=0.3, warmup=4, first_pause=5, max_pause=8)
    for _ in range(4):
        assert g.open()
        g.record(4, 0)
    assert [g.open() for _ in range(6)] == [False] * 5 + [True]
    for _ in range(4):
        g.record(4, 0)
    assert [g.open() for _ in range(9)] == [False] * 8 + [True]  # doubled, capped
    good = AcceptanceGate(warmup=2)
    for _ in range(20):
        good.record(4, 3)
        assert good.open()


# ---------------------------------------------------------------- the cache's continuation
def test_continuation_reads_other_requests_text_without_touching_the_tree():
    cache = RadixCache(lambda s: None)
    cache.insert([1, 2, 3, 4, 5, 6], T(11, 12, 13, 14, 15, 16))
    _, node = cache.match_prefix([1, 2])  # splits: node ends after "1 2"
    stamps = [n.last_access for n in cache.all_nodes()]
    assert continuation(node, [3], 2) == [4, 5]
    assert continuation(node, [3, 4, 5, 6], 3) == []  # nothing after the end
    assert continuation(node, [3, 9], 3) == []  # diverges
    assert continuation(node, [], 9) == [3, 4, 5, 6]
    assert continuation(cache.root, [1, 2, 3], 2) == [4, 5]
    cache.insert([1, 2, 3, 7, 8], T(11, 12, 13, 17, 18))  # a fork: the more recent branch wins
    assert continuation(cache.root, [1, 2, 3], 2) == [7, 8]
    assert len(cache.all_nodes()) == 4 and stamps  # no split by the look-ups


def test_kv_manager_discards_rejected_slots():
    kv, _, cache, _ = make_kv(64, 4, 32)
    req = Req("r", [1, 2, 3, 4], SamplingParams(max_new_tokens=8))
    match = kv.match_and_lock(req)
    assert kv.admit(req, match, 4)
    req.kv_len = 4
    req.output_ids.append(5)
    assert kv.alloc_extend([(req, 1 + 3)])  # last token + 3 proposals
    free = kv.free_slots()
    req.kv_len += 2  # the last token and one accepted proposal are kept
    kv.discard_rejected(req, 2)
    assert kv.free_slots() == free + 2
    assert kv.row(req)[req.kv_len: req.kv_len + 2].tolist() == [0, 0]
    kv.check_invariants()
    req.output_ids += [6, 7]
    assert kv.continuation(req, 3) == []
    kv.release(req)
    kv.check_invariants()
    other = Req("o", [1, 2, 3, 4, 5], SamplingParams(max_new_tokens=8))
    m = kv.match_and_lock(other)
    assert kv.admit(other, m, 1)
    assert kv.continuation(other, 3) == [6]  # what the first request computed after the same text
    other.kv_len = 5
    kv.release(other)
    kv.check_invariants()
    assert kv.free_slots() + cache.evictable_size == kv.capacity


# ---------------------------------------------------------------- acceptance rules
def test_greedy_accept_takes_the_agreeing_prefix_then_the_targets_token():
    assert greedy_accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert greedy_accept([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert greedy_accept([5], [4, 1]) == [4]
    assert greedy_accept([], [3]) == [3]


def _broken_always_accept(probs, drafts, gens, draft_probs=None):
    return list(drafts) + [sample_from(probs[len(drafts)], gens[len(drafts)])]


def _broken_no_residual(probs, drafts, gens, draft_probs=None):
    """Rejects correctly, but corrects from ``p`` itself (the drafted token can come back)."""
    out = []
    for j, d in enumerate(drafts):
        if float(torch.rand((), generator=gens[j])) < float(probs[j, d]):
            out.append(d)
            continue
        out.append(sample_from(probs[j], gens[j]))
        return out
    out.append(sample_from(probs[len(drafts)], gens[len(drafts)]))
    return out


def _emitted_pairs(rule, probs, drafts, draft_probs, trials: int) -> tuple[torch.Tensor, torch.Tensor]:
    V = probs.shape[1]
    first = torch.zeros(V, dtype=torch.float64)
    second = torch.zeros(V, dtype=torch.float64)  # second token, given the first was drafts[0]
    for i in range(trials):
        gens = [torch.Generator().manual_seed(1000 * i + j) for j in range(len(drafts) + 1)]
        if draft_probs is not None:  # a draft model's proposals are samples of its q
            drafts = [sample_from(draft_probs[j], torch.Generator().manual_seed(10**6 + 1000 * i + j))
                      for j in range(len(drafts))]
        out = rule(probs, drafts, gens, draft_probs)
        first[out[0]] += 1
        if out[0] == drafts[0] and len(out) > 1:
            second[out[1]] += 1
    return first, second


@pytest.mark.parametrize("rule,ok", [(rejection_accept, True), (_broken_always_accept, False),
                                     (_broken_no_residual, False)])
@pytest.mark.parametrize("with_q", [False, True])
def test_rejection_sampling_matches_the_target_distribution(rule, ok, with_q):
    """Every emitted token must be distributed as the target's ``p``: the first (draft
    accepted with p/q, else the residual) and the second given the first was accepted."""
    if with_q and rule is _broken_no_residual:
        pytest.skip("the broken residual rule is written for point-mass proposals")
    g = torch.Generator().manual_seed(0)
    V = 6
    probs = torch.softmax(torch.randn(3, V, generator=g) * 1.2, -1)
    probs[1, 4] = 0.0  # a token the target never emits (e.g. filtered by top-k)
    probs[1] /= probs[1].sum()
    drafts = [2, 4]  # point mass: the second proposal has target probability 0 (always rejected)
    draft_probs = torch.softmax(torch.randn(2, V, generator=g), -1) if with_q else None
    first, second = _emitted_pairs(rule, probs, drafts, draft_probs, 4000)
    p1 = goodness_of_fit(first, probs[0]) if first[probs[0] == 0].sum() == 0 else 0.0
    p2 = goodness_of_fit(second, probs[1]) if second[probs[1] == 0].sum() == 0 else 0.0
    if ok:
        assert min(p1, p2) > 1e-3, (p1, p2)
    else:
        assert min(p1, p2) < 1e-3, (p1, p2)
