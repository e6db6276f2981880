"""frontend_lang pieces that need no model: choice-scoring methods, the token-junction
rule of select, run_batch's shared-prefix cut, expressions and sampling merges."""
from __future__ import annotations

import pytest

from frontend_lang import gen, select, user
from frontend_lang.batch import resolve_threads, shared_prefix
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.choice_scoring import greedy_token_selection, resolve, token_length_normalized, \
    unconditional_likelihood_normalized
from frontend_lang.ir import Gen, RoleBegin, RoleEnd, Select, Text, flatten
from frontend_lang.sampling import SamplingOverrides
from frontend_lang.select_op import divergence


def test_token_length_normalized_picks_best_mean():
    index, scores = token_length_normalized([[-1.0, -3.0], [-1.5], [-0.5, -4.0, -0.1]])
    assert scores == pytest.approx([-2.0, -1.5, -4.6 / 3])
    assert index == 1


def test_greedy_token_selection_compares_position_by_position():
    # the first token decides between 0 and 1; 2 loses at position 0
    assert greedy_token_selection([[-1.0, -9.0], [-2.0, -0.1], [-5.0]])[0] == 0
    # a tie at position 0 goes on to position 1; a choice out of tokens uses its mean
    assert greedy_token_selection([[-1.0, -0.5], [-1.0, -0.2], [-1.0]])[0] == 1
    assert greedy_token_selection([[-1.0, -3.0], [-1.0]])[0] == 1


def test_unconditional_likelihood_normalized():
    index, scores = unconditional_likelihood_normalized([[-2.0], [-1.0]], [[-0.5], [-3.0]])
    assert scores == pytest.approx([-1.5, 2.0]) and index == 1
    with pytest.raises(ValueError):
        unconditional_likelihood_normalized([[-1.0]])
    assert resolve("greedy_token_selection") is greedy_token_selection
    with pytest.raises(ValueError, match="choices_method"):
        resolve("nope")


def test_divergence_handles_token_merges_at_the_junction():
    assert divergence([1, 2, 3], [1, 2, 3, 4, 5]) == 3  # clean junction
    assert divergence([1, 2, 3], [1, 2, 9, 5]) == 2  # the prefix's last token merged into the choice
    assert divergence([], [7, 8]) == 0
    assert divergence([1, 2, 3], [1, 2, 3]) == 2  # never past the last token


def test_shared_prefix_cuts_before_whitespace():
    texts = ["SYS: be brief.\nQ: what is one", "SYS: be brief.\nQ: what is two"]
    assert shared_prefix(texts) == "SYS: be brief.\nQ: what is"
    assert shared_prefix(["abc", "abd"]) == ""
    assert shared_prefix(["same text", "same text"]) == "same text"
    assert resolve_threads("auto", 5) == 5 and resolve_threads(2, 10) == 2
    with pytest.raises(ValueError):
        resolve_threads(0, 3)


def test_expressions_flatten_in_order():
    ops = flatten(user("hi " + gen("x", max_tokens=3)) + "tail")
    assert [type(o) for o in ops] == [RoleBegin, Text, Gen, RoleEnd, Text]
    assert ops[2].sampling.max_new_tokens == 3 and ops[2].name == "x"
    assert isinstance(gen("c", choices=["a", "b"]), Select)  # gen with choices is a select (as in SGLang)
    with pytest.raises(ValueError):
        select("c", [])
    with pytest.raises(TypeError):
        flatten(3)


def test_sampling_overrides_merge_and_split():
    run_defaults = SamplingOverrides.of(temperature=0.0, max_new_tokens=16, return_logprob=True)
    params, options = run_defaults.merged(SamplingOverrides.of(max_new_tokens=4, stop="\n")).split()
    assert params == {"temperature": 0.0, "max_new_tokens": 4, "stop": "\n"}
    assert options == {"return_logprob": True}


def test_chat_template_markers_reproduce_the_template():
    tpl = ChatTemplate("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}[SYS default]"
                       "{% endif %}<{{ m['role'] }}>{{ m['content'] | trim }}</s>{% endfor %}"
                       "{% if add_generation_prompt %}<assistant>{% endif %}", {"bos_token": "<s>"})
    assert tpl.begin([], "", "user") == "[SYS default]<user>"
    assert tpl.begin([], "", "system") == "<system>"
    history = [{"role": "user", "content": "hi"}]
    rendered = tpl.render(history)
    assert tpl.begin(history, rendered, "assistant") == "<assistant>"
    # content the template trims cannot be un-emitted: the closing marker still comes out
    closing, after = tpl.end(history, rendered + "<assistant> x ", "assistant", " x ")
    assert closing == "</s>" and after == rendered + "<assistant>x</s>"
