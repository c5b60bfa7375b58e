from smollab.cli import main


def test_sample_from_run_dir(micro_model, capsys):
    code = main(
        [
            "sample",
            str(micro_model),
            "--prompt",
            "once upon a time",
            "--prompt",
            "one day",
            "--n",
            "2",
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("[once upon a time] once upon a time") == 2
    assert out.count("[one day] one day") == 2


def test_sample_is_reproducible_and_greedy_is_deterministic(micro_model, capsys):
    args = ["sample", str(micro_model), "--prompt", "the cat", "--max-new-tokens", "6"]
    main([*args, "--seed", "1"])
    first = capsys.readouterr().out
    main([*args, "--seed", "1"])
    assert capsys.readouterr().out == first
    main([*args, "--temperature", "0", "--seed", "5"])
    g1 = capsys.readouterr().out
    main([*args, "--temperature", "0", "--seed", "6"])
    assert capsys.readouterr().out == g1


def test_sample_bad_input(micro_model, tmp_path, capsys):
    assert main(["sample", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["sample", str(micro_model), "--prompt", "x", "--top-p", "0"]) == 2
    assert "--top-p" in capsys.readouterr().err
