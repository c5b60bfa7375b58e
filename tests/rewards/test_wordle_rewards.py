"""Wordle rewards on hand-made completions and prompts; information gain against a brute-force
count; the recipe's reward list resolves."""

import math
from collections import Counter

import pytest

from smollab.config.load import load_config
from smollab.data.wordle import WORDS, build_chat, build_prompt, feedback, history_row
from smollab.data.wordle_games import game_rows
from smollab.errors import UserError
from smollab.rewards import validate_specs
from smollab.rewards.wordle import (
    info_gain_plain,
    wordle_feedback_use,
    wordle_format,
    wordle_info_gain,
    wordle_solved,
)

# shore and flute against the secret apple leave four candidates: apple eagle ladle maple
HISTORY = [("shore", "xxxxg"), ("flute", "xyxxg")]
PROMPT = build_prompt(HISTORY)


def ans(word: str) -> str:
    return f"<think>four left</think><guess>{word}</guess>"


def test_format_quarter_per_property():
    texts = [
        ans("apple"),  # all four
        " <think>\nhm</think>  <guess> Apple </guess>\n",  # spaces and case are allowed
        ans("zzzzz"),  # five letters, not a listed word
        ans("cat"),  # tags only
        "<guess>apple</guess> and more",  # tag, five letters, listed; not the exact form
        "<think>apple</think>",  # no guess tag
        "apple",
        "",
    ]
    assert wordle_format(texts) == [1.0, 1.0, 0.75, 0.5, 0.75, 0.0, 0.0, 0.0]


def test_feedback_use_is_share_of_earlier_feedback_respected():
    got = wordle_feedback_use(
        [ans("maple"), ans("table"), ans("shore"), ans("zzzzz"), ans("cat"), "maple", ans("lemon")],
        prompts=[PROMPT] * 6 + [build_prompt([])],
    )
    # table fits shore's xxxxg, but flute against table is xyxyg (its t), not xyxxg
    assert feedback("table", "flute") == "xyxyg" and feedback("table", "shore") == "xxxxg"
    # shore vs itself is ggggg, not xxxxg; vs flute: e green -> xxxxg != xyxxg
    assert got == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0]


def brute_force(prompt_history, guess):
    cands = [w for w in WORDS if all(feedback(w, g) == fb for g, fb in prompt_history)]
    sizes = Counter(feedback(c, guess) for c in cands).values()
    n = len(cands)
    if n == 1:
        return 1.0 if guess == cands[0] else 0.0
    return sum(k / n * math.log2(n / k) for k in sizes) / math.log2(n)


def test_info_gain_hand_values_on_four_candidates():
    got = wordle_info_gain(
        [ans("eagle"), ans("table"), ans("zzzzz"), ans("cat"), "junk"], prompts=[PROMPT] * 5
    )
    # eagle splits {apple eagle ladle maple} 2/1/1: 1.5 bits of log2(4) = 2
    # table 3/1: 0.8113 bits; zzzzz: one block, 0 bits; unreadable guesses: 0
    assert got == pytest.approx([0.75, 0.811278 / 2, 0.0, 0.0, 0.0], abs=1e-6)


def test_info_gain_matches_brute_force_count():
    histories = [
        [],
        HISTORY,
        [("shore", "xxxxg")],  # twelve candidates
        [("brave", feedback("zebra", "brave"))],
        [("apple", "xxxxx"), ("zebra", "xxxxx")],
        [("shore", "xxxxg"), ("flute", "xyxxg"), ("eagle", "xgxgg")],  # two left
        [("shore", "xxxxg"), ("flute", "xyxxg"), ("table", "xyxgg")],  # one left: apple
    ]
    guesses = ["eagle", "table", "maple", "zzzzz", "quiet", "ladle", "apple", "pizza"]
    comps, prompts, want = [], [], []
    for h in histories:
        for g in guesses:
            comps.append(ans(g))
            prompts.append(build_prompt(h))
            want.append(brute_force(h, g))
    assert wordle_info_gain(comps, prompts=prompts) == pytest.approx(want, abs=1e-9)
    assert info_gain_plain(comps, prompts) == pytest.approx(want, abs=1e-9)
    one_left = build_prompt(histories[-1])
    assert wordle_info_gain([ans("apple"), ans("eagle")], prompts=[one_left] * 2) == [1.0, 0.0]


def test_info_gain_with_no_consistent_word_is_zero():
    impossible = build_prompt([("apple", "ggggx"), ("apple", "xxxxx")])
    assert wordle_info_gain([ans("eagle")], prompts=[impossible]) == [0.0]


@pytest.mark.parametrize("fn", [wordle_feedback_use, wordle_info_gain])
def test_prompt_rewards_need_one_prompt_per_completion(fn):
    with pytest.raises(UserError, match=f"{fn.__name__}: needs one prompt per completion"):
        fn([ans("apple")], prompts=None)
    with pytest.raises(UserError, match=f"{fn.__name__}: needs one prompt per completion"):
        fn([ans("apple")] * 2, prompts=[PROMPT])


def test_the_history_column_scores_as_the_prompt_does_and_is_read_instead():
    rows = game_rows(40, seed=2)
    texts = [ans(w) for w in ("maple", "shore", "zebra", "apple")] * 10
    prompts = [r["prompt"] for r in rows]
    column = [r["past_guess_history"] for r in rows]
    for fn in (wordle_feedback_use, wordle_info_gain):
        from_prompts = fn(texts, prompts=prompts)
        assert fn(texts, prompts=prompts, past_guess_history=column) == from_prompts
        assert fn(texts, prompts=["?"] * 40, past_guess_history=column) == from_prompts
    assert any(x not in (0.0, 1.0) for x in wordle_info_gain(texts, prompts=prompts))


def test_solved_reads_the_secret_column_and_every_reward_reads_trl_s_chat_form():
    secrets = ["APPLE", "apple", "ZEBRA"]
    texts = [ans("apple"), ans("APPLE"), ans("apple")]
    assert wordle_solved(texts, secret=secrets) == [1.0, 1.0, 0.0]
    chat = [[{"role": "assistant", "content": t}] for t in texts]
    asked = [build_chat(HISTORY)] * 3
    column = [history_row(HISTORY)] * 3
    assert wordle_solved(chat, secret=secrets, prompts=asked) == [1.0, 1.0, 0.0]
    assert wordle_format(chat) == wordle_format(texts)
    assert wordle_info_gain(chat, prompts=asked) == wordle_info_gain(
        texts, prompts=[PROMPT] * 3, past_guess_history=column
    )
    # a task without the secret column cannot pay for solving: refused before the run
    with pytest.raises(UserError, match="wordle_solved: missing required param 'secret'"):
        validate_specs([{"name": "wordle_solved"}], ["past_guess_history"], "grpo.prompts_file g")


def test_recipe_rewards_resolve():
    for recipe in ("wordle", "wordle-chat-lora"):
        cfg = load_config("grpo", recipe)
        keys = [r.key for r in validate_specs(cfg.reward, ["secret", "past_guess_history"], "t")]
        assert keys == ["wordle_format", "wordle_feedback_use", "wordle_info_gain", "wordle_solved"]
        assert cfg.grpo.prompts_file.endswith(".jsonl")
    assert load_config("grpo", "wordle-chat-lora").train.epochs == 2
