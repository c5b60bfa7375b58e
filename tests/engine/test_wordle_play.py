"""Whole Wordle games played by a model: `smollab sample RUN --wordle-games N`."""

from __future__ import annotations

import json
import shutil

from smollab.cli import main
from smollab.data.wordle_games import solver_generate
from smollab.engine import wordle_play
from smollab.engine.sample_texts import load_sampler

KEYS = {
    "games",
    "solved",
    "turns",
    "solve_rate",
    "mean_guesses",
    "invalid_rate",
    "format_error_rate",
    "max_turns",
    "model",
    "temperature",
    "seed",
    "wall_s",
}


def test_micro_model_plays_games_and_writes_the_report_beside_it(micro_model, tmp_path, capsys):
    ckpt = shutil.copytree(micro_model / "checkpoints" / "final", tmp_path / "final")
    code = main(
        [
            "sample",
            str(ckpt),
            "--wordle-games",
            "3",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    assert "0/3 games solved" in capsys.readouterr().out
    report = json.loads((ckpt / "wordle_games.json").read_text())
    assert set(report) >= KEYS
    # A story model guesses no word: every game runs all its turns, every turn is wasted.
    assert (report["games"], report["solved"], report["turns"]) == (3, 0, 6)
    assert report["solve_rate"] == 0.0 and report["mean_guesses"] is None
    assert report["invalid_rate"] == 1.0 and 0.0 <= report["format_error_rate"] <= 1.0
    assert report["temperature"] == 0.0 and report["model"] == str(ckpt)
    assert report["prompts"] == "text"  # no chat template: the one-line prompt


def test_a_generate_fn_playing_the_solver_solves_every_game(micro_model, tmp_path, monkeypatch):
    monkeypatch.setattr(wordle_play, "sampler_generate_fn", lambda *a, **k: solver_generate)
    out = tmp_path / "games.json"
    got = wordle_play.play_wordle(str(micro_model), 12, seed=4, out=out, device="cpu")
    report = json.loads(out.read_text())
    assert got["path"] == str(out) and {k: got[k] for k in report} == report
    assert (report["games"], report["solved"], report["solve_rate"]) == (12, 12, 1.0)
    assert 1.0 <= report["mean_guesses"] <= 6.0 and report["turns"] == 12 * report["mean_guesses"]
    assert report["invalid_rate"] == 0.0 and report["format_error_rate"] == 0.0


def test_generate_fn_batches_and_is_reproducible(micro_model):
    sampler, tokenizer, _ = load_sampler(str(micro_model), "cpu")
    calls = []
    generate = sampler.generate

    def counting(ids, *a, **k):
        calls.append(len(ids))
        return generate(ids, *a, **k)

    sampler.generate = counting
    prompts = [f"next guess {i}:" for i in range(5)]

    def run(temperature):
        fn = wordle_play.sampler_generate_fn(
            sampler, tokenizer, max_new_tokens=4, temperature=temperature, seed=1, batch_size=2
        )
        return fn(prompts), fn(prompts)

    first, second = run(1.0)
    assert calls == [2, 2, 1, 2, 2, 1] and len(first) == 5
    assert run(1.0) == (first, second)  # one seed, the same games
    greedy = run(0.0)
    assert greedy[0] == greedy[1]  # greedy: turns with the same prompts agree


def test_wordle_games_bad_input(micro_model, capsys):
    cases = [
        (["--prompt", "x", "--wordle-games", "2"], "drop --prompt"),
        ([], "give --prompt"),
        (["--prompt", "x", "--max-turns", "3"], "only with --wordle-games"),
        (["--wordle-games", "0"], "at least 1"),
    ]
    for extra, message in cases:
        assert main(["sample", str(micro_model), *extra]) == 2
        assert message in capsys.readouterr().err
    assert main(["sample", "gpt2", "--wordle-games", "2"]) == 2  # a hub id: nowhere to write
    assert "--wordle-out" in capsys.readouterr().err


def test_a_chat_model_plays_from_chat_prompts(replicas, tmp_path, monkeypatch):
    """A model with a chat template (the chat recipe's kind) gets each position as chat
    messages through its template, as it was trained; the solver standing in for the model
    reads the same game from them."""
    seen = []
    real = wordle_play.sampler_generate_fn

    def spy(*a, **k):
        fn = real(*a, **k)

        def generate(prompts):
            seen.extend(prompts)
            return fn(prompts)

        return generate

    monkeypatch.setattr(wordle_play, "sampler_generate_fn", spy)
    out = tmp_path / "games.json"
    report = wordle_play.play_wordle(
        str(replicas("qwen2.5")), 2, max_turns=2, max_new_tokens=4, out=out, device="cpu"
    )
    assert report["prompts"] == "chat" and report["games"] == 2 and report["turns"] >= 2
    assert all(p[0]["role"] == "system" and p[1]["role"] == "user" for p in seen)
    monkeypatch.setattr(wordle_play, "sampler_generate_fn", lambda *a, **k: solver_generate)
    solved = wordle_play.play_wordle(str(replicas("qwen2.5")), 6, out=out, device="cpu")
    assert solved["solve_rate"] == 1.0
