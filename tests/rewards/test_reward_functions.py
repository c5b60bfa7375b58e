"""Built-in rewards on crafted strings, with the expected values written out by hand."""

import pytest

from smollab.errors import UserError
from smollab.rewards.happy import happy_binary, happy_count
from smollab.rewards.length import sentence_length
from smollab.rewards.sentiment import sentiment


def test_happy_binary_is_case_insensitive_substring():
    got = happy_binary(
        ["I am Happy", "so unhappy", "sad", "HAPPY HAPPY"], prompts=None, completion_ids=[]
    )
    assert got == [1.0, 1.0, 0.0, 1.0]


def test_happy_count_and_cap():
    texts = ["happy happy HAPPY", "no", "Happy."]
    assert happy_count(texts) == [3.0, 0.0, 1.0]
    assert happy_count(texts, cap=2) == [2.0, 0.0, 1.0]
    with pytest.raises(UserError, match="happy_count: cap"):
        happy_count(texts, cap=-1)


def test_sentiment_vader_compound_and_rescale():
    texts = ["happy", "I love this, it is wonderful!", "This is terrible and awful.", ""]
    # VADER: "happy" has valence 2.7, compound = 2.7 / sqrt(2.7^2 + 15) = 0.5719 (4 decimals)
    assert sentiment(texts) == [0.5719, 0.8478, -0.7269, 0.0]
    assert sentiment(texts, rescale=True) == pytest.approx([0.78595, 0.9239, 0.13655, 0.5])


def test_sentence_length_words_mean_of_complete_sentences():
    # sentences of 3 and 5 words: mean 4
    text = "One two three. Four five six seven eight!"
    assert sentence_length([text], target=4, unit="words", mode="exact") == [1.0]
    assert sentence_length([text], target=5, unit="words", mode="exact") == [0.0]
    assert sentence_length([text], target=5, unit="words", mode="smooth") == pytest.approx([0.8])
    assert sentence_length([text], target=10, unit="words", mode="smooth") == [0.0]  # 6 away
    # the unfinished fragment is left out: n = 3
    assert sentence_length(["One two three. four five"], target=3, mode="exact") == [1.0]
    # no sentence end: the whole completion, 4 words
    assert sentence_length(["one two three four"], target=4, mode="exact") == [1.0]
    # runs of terminators end one sentence; a lone quote mark is not a word
    assert sentence_length(['Wait... Really?! " Yes.'], target=1, mode="exact") == [1.0]
    # the mean of 9 and 11 is 10 (documented consequence of the mean)
    nine, eleven = " ".join(["a"] * 9) + ".", " ".join(["b"] * 11) + "."
    assert sentence_length([f"{nine} {eleven}"], target=10, mode="exact") == [1.0]
    assert sentence_length([""], target=1, mode="smooth") == pytest.approx([0.8])  # n = 0


def test_sentence_length_per_sentence_averages_the_scores():
    # 9 and 11 words: each 1 away, 0.8 each (the mean length would score 1.0)
    nine, eleven = " ".join(["a"] * 9) + ".", " ".join(["b"] * 11) + "!"
    got = sentence_length([f"{nine} {eleven} tail"], target=10, per_sentence=True)
    assert got == pytest.approx([0.8])
    # 10 and 16 words: 1.0 and 0.0; no complete sentence: 0.0 (not the whole text's length)
    ten, sixteen = " ".join(["a"] * 10) + ".", " ".join(["b"] * 16) + "."
    assert sentence_length([f"{ten} {sixteen}"], per_sentence=True) == pytest.approx([0.5])
    assert sentence_length([" ".join(["a"] * 10)], per_sentence=True) == [0.0]
    # tokens: 12 over "Tom ran." (7 non-space chars), "Sue sat down." (11) and "Go" (2): 4.2
    # and 6.6 tokens, scored 0.96 and 0.48
    ids = [[0] * 12]
    text = "Tom ran. Sue sat down. Go"
    got = sentence_length([text], target=4, unit="tokens", per_sentence=True, completion_ids=ids)
    assert got == pytest.approx([0.72])
    with pytest.raises(UserError, match="per_sentence must be true or false"):
        sentence_length(["a."], per_sentence="yes")


def test_sentence_length_tokens():
    # ends at a sentence end: 8 tokens over 2 sentences, n = 4
    ids8 = [[0] * 8]
    assert sentence_length(
        ["Tom ran. Sue sat."], target=4, unit="tokens", mode="exact", completion_ids=ids8
    ) == [1.0]
    # fragment: 5 tokens, 7 of 10 non-space chars complete, 1 sentence: n = 3.5
    ids5 = [[0] * 5]
    got = sentence_length(
        ["Tom ran. Sue"], target=4, unit="tokens", mode="smooth", completion_ids=ids5
    )
    assert got == pytest.approx([0.9])
    assert sentence_length(
        ["Tom ran. Sue"], target=4, unit="tokens", mode="exact", completion_ids=ids5
    ) == [1.0]
    # no sentence end: the token count
    assert sentence_length(
        ["Tom ran"], target=3, unit="tokens", mode="exact", completion_ids=[[1, 2, 3]]
    ) == [1.0]
    with pytest.raises(UserError, match="needs completion_ids"):
        sentence_length(["Tom ran."], unit="tokens")


@pytest.mark.parametrize(
    "params, match",
    [({"unit": "lines"}, "unit"), ({"mode": "fuzzy"}, "mode"), ({"target": 0}, "target")],
)
def test_sentence_length_bad_params(params, match):
    with pytest.raises(UserError, match=f"sentence_length: {match}"):
        sentence_length(["a."], completion_ids=[[1]], **params)
