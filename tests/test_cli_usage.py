"""The CLI as a newcomer meets it: --version, help with examples, early argument checks, the
per-stage summary, --no-progress, machine faults as one line, the README's config as shipped."""

import errno
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, config_dict, moai_cli, subprocess_env
from moai.cli import EXAMPLES, environment_error, main
from moai.report import stage_table

ROOT = Path(__file__).resolve().parents[1]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"moai \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_every_subcommand_help_has_examples_and_every_option_a_help_text(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "examples:\n  moai " + command in text
    # argparse prints an option's help on its line or, for a long option, on the next one
    lines = text.split("options:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    for i, line in enumerate(lines):
        if line.startswith("  -") and not re.search(r"\S  +\S", line.strip()):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            assert following.startswith(" " * 10), f"{command}: {line.strip()} has no help text"


@pytest.mark.parametrize(
    "index, shards, says",
    [("4", "4", "--shard-index 4 is out of range for --num-shards 4: use 0 to 3"), ("0", "0", "--num-shards 0")],
)
def test_tokenize_shard_arguments_are_checked_before_any_stage(tmp_path, corpus, capsys, index, shards, says):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}})))
    started = time.monotonic()
    code = main(["tokenize-shard", str(cfg), "--shard-index", index, "--num-shards", shards])
    assert code == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moai: error: ") and says in err[0]
    assert not (tmp_path / "cache").exists()  # no stage ran


def test_merge_refuses_zero_shards(tmp_path, corpus, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}})))
    assert main(["merge", str(cfg), "--num-shards", "0"]) == 2
    assert "moai: error: --num-shards 0: must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


def test_stage_table_shows_built_or_reused_rows_dropped_and_seconds():
    lines = stage_table(
        {
            "convert": {
                "built": True,
                "rows_in": 3000,
                "rows_out": 2990,
                "dropped": {"malformed_json": 10},
                "seconds": 1.25,
            },
            "filter": {"built": False, "rows_in": 2990, "rows_out": 2984, "dropped": {"empty": 6}, "seconds": 0.03},
            "tokenizer": {"built": True, "seconds": 2.0},
            "tokenize": {"built": True, "rows_in": 2984, "rows_out": 2984, "tokens": 161699, "seconds": 0.4},
            "pack": {"built": True, "rows_in": 2984, "rows_out": 631, "samples": {"train": 600, "validation": 31}},
        }
    )
    assert len(lines) == 5
    assert re.match(r"convert +built +3,000 → 2,990 +dropped: malformed_json 10 +1\.2s$", lines[0])
    assert re.match(r"filter +reused +2,990 → 2,984 +dropped: empty 6 +\(built in 0\.0s\)$", lines[1])
    assert "161,699 tokens" in lines[3] and "samples train 600, validation 31" in lines[4]


def test_stage_table_shows_mix_as_windows_to_samples_best_fit_padding_and_readable_throughput():
    lines = stage_table(
        {
            "tokenize": {
                "built": True,
                "rows_in": 10,
                "rows_out": 10,
                "tokens": 900,
                "seconds": 1.5,
                "mb_per_s": 0.0041,
            },
            "save": {"built": True, "rows_in": 10, "rows_out": 10, "seconds": 0.01, "mb_per_s": 103.4},
            "filter": {"built": True, "rows_in": 10, "rows_out": 10, "seconds": 0.2, "mb_per_s": 0.66},
            "mix": {
                "built": True,
                "rows_in": 239,
                "rows_out": 250,
                "samples": {"train": 240, "validation": 10},
                "padding_fraction": 0.00071,
                "documents_split": 12,
                "repetition": {"ko": 1.9, "en": 0.5},
            },
        }
    )
    assert lines[0].endswith("1.5s  0.0041 MB/s") and lines[1].endswith("0.0s  103 MB/s")
    assert lines[2].endswith("0.2s  0.66 MB/s")
    assert re.match(
        r"mix +built +239 windows → 250 samples +samples train 240, validation 10; padding 0\.071%; "
        r"12 documents split; repetition ko ×1\.90, en ×0\.50$",
        lines[3],
    ), lines[3]


def test_stage_table_shows_code_kept_without_being_judged():
    quality = {"built": True, "rows_in": 900, "rows_out": 850, "dropped": {"gopher:word_count": 50}}
    lines = stage_table({"quality": quality | {"counts": {"code_exempt": 1234}, "seconds": 0.5}})
    assert re.match(r"quality +built +900 → 850 +dropped: gopher:word_count 50; code_exempt 1,234 +0\.5s$", lines[0])


@pytest.mark.parametrize(
    "err, says",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/tmp/x/.moai/convert/.tmp-1/data.arrow"), "no space left"),
        (PermissionError(errno.EACCES, "Permission denied", "/data/cache"), "permission denied: /data/cache"),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/.moai"), "read-only file system: /mnt/ro/.moai"),
    ],
)
def test_machine_faults_are_one_line_naming_the_path_and_the_fix(err, says):
    line = environment_error(err)
    assert line is not None and "\n" not in line
    assert says in line and "cache_dir" in line
    if err.errno == errno.ENOSPC:
        assert "/tmp/x/.moai/convert/.tmp-1/data.arrow" in line and "GB free there now" in line


def test_other_os_errors_keep_their_traceback():
    assert environment_error(OSError(errno.EBADF, "Bad file descriptor")) is None


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _readme_config() -> str:
    readme = _readme()
    block = re.search(r"## Your data and your tokenizer.*?```yaml\n(.*?)```", readme, flags=re.S)
    assert block, "README has no config block under 'Your data and your tokenizer'"
    return block.group(1)


def test_readme_config_is_the_shipped_example_and_names_files_that_exist():
    text = _readme_config()
    assert text == (ROOT / "examples" / "quickstart.yaml").read_text()
    config = yaml.safe_load(text)
    assert sorted(ROOT.glob(config["source"]["path"]))
    assert (ROOT / config["tokenizer"]["path"] / "tokenizer.json").is_file()
    assert (ROOT / config["train"]["model_config"]).is_file()


def test_runs_folder_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "runs/my-run/metrics.jsonl"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, "runs/ is not git-ignored"


@pytest.mark.slow
def test_readme_config_prepares_as_pasted_with_a_summary_and_no_bars(tmp_path):
    """The README's config, pasted into my.yaml in a copy of the repository's examples: prepare
    runs, prints one summary line per stage, and --no-progress leaves no progress bar."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "my.yaml").write_text(_readme_config())
    out = moai_cli("prepare", "my.yaml", "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Saving the dataset" not in out.stderr and "it/s" not in out.stderr
    summary = [line for line in out.stderr.splitlines() if re.match(r"moai: \w+ +(built|reused) ", line)]
    assert [line.split()[1] for line in summary] == ["convert", "filter", "save", "tokenizer", "tokenize", "pack"]
    assert "dropped: empty 6" in out.stderr  # the example data has 6 empty texts, counted where users see them

    # stderr is the table the README shows, line for line (not the seconds), and nothing else
    def counts(lines):
        return [" ".join(re.sub(r"\s+[\d.]+s(\s+[\d.,]+ MB/s)?$", "", line).split()) for line in lines]

    shown = re.search(r"`moai prepare my.yaml` on the example prints.*?```\n(.*?)```", _readme(), flags=re.S)
    assert shown and counts(out.stderr.splitlines()) == counts(shown.group(1).splitlines())


@pytest.mark.parametrize("name", ["quickstart.yaml", "instruct-jsonl.yaml"])
def test_local_examples_name_files_that_exist(name):
    from moai.config import load_config

    config = load_config(ROOT / "examples" / name)
    assert config.source.path is not None and sorted(ROOT.glob(config.source.path))
    assert config.tokenizer.path is not None and (ROOT / config.tokenizer.path / "tokenizer.json").is_file()
    if config.train is not None and isinstance(config.train.model, str):
        assert (ROOT / config.train.model).is_file()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["plan"], "the following arguments are required: config (see: moai plan --help)"),
        (["tokenize-shard", "x", "--shard-index", "a", "--num-shards", "2"], "invalid int value: 'a'"),
        (["cache"], "(see: moai cache --help)"),
        ([], "arguments are required: command"),
    ],
)
def test_usage_mistakes_are_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("moai: error: ") and says in err[0]


def test_the_mix_example_names_files_that_exist():
    from moai.config import load_config

    config = load_config(ROOT / "examples" / "mix.yaml")
    assert [s.name for s in config.sources or []] == ["ko", "code", "en"]
    for s in config.sources or []:
        assert s.path is not None and sorted(ROOT.glob(s.path)), s.name
    assert config.tokenizer.path is not None and (ROOT / config.tokenizer.path / "tokenizer.json").is_file()
    assert config.train is not None and isinstance(config.train.model, str) and (ROOT / config.train.model).is_file()


@pytest.mark.slow
def test_the_mix_example_prepares_with_a_line_per_source_stage_and_its_shares(tmp_path):
    """examples/mix.yaml from a copy of the examples: a summary line per source's stage, then mix;
    the last line's "mix" gives each source its exact share of the training's tokens."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    out = subprocess.run(
        [PYTHON, "-m", "moai.cli", "prepare", "examples/mix.yaml", "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**subprocess_env(), "CUDA_VISIBLE_DEVICES": ""},  # the budget counts 1 process on CPU
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = [line.split()[1] for line in out.stderr.splitlines() if re.match(r"moai: \S+ +(built|reused) ", line)]
    assert summary[:3] == ["convert[ko]", "convert[code]", "convert[en]"] and summary[-1] == "mix"
    mixed = json.loads(out.stdout.splitlines()[-1])["mix"]
    assert mixed["tokens"] == 30 * 8 * 128
    assert [(s["name"], s["realised_tokens"]) for s in mixed["sources"]] == [
        ("ko", 18432),
        ("code", 9216),
        ("en", 3072),
    ]
    assert mixed["sources"][0]["epochs"] > 2  # ko repeats, within its max_repetition of 4


def test_a_typo_d_key_names_the_key_it_meant():
    from moai.config import ConfigError, parse_config

    data = {"source": {"path": "x", "text_feild": "t"}, "tokenizer": {"path": "t"}, "train": {"max_step": 3}}
    with pytest.raises(ConfigError) as err:
        parse_config({**data, "train": {"model_config": {"model_type": "llama"}, "max_step": 3}}, "c.yaml")
    assert "train.max_step: unknown key (did you mean max_steps?)" in str(err.value)
    assert "source.text_feild: unknown key (did you mean text_field?)" in str(err.value)


def test_verbose_after_the_command(tmp_path, corpus, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}})))
    assert main(["plan", str(cfg), "-v"]) == 0


def test_prepare_checks_seq_len_against_the_model_in_one_line(tmp_path, corpus, capsys):
    model = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "max_position_embeddings": 32}
    data = config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}, train={"model_config": model})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))  # pack.seq_len 64 > 32; val_fraction would also warn
    assert main(["prepare", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [err[0]] and err[0].startswith("moai: error: pack.seq_len 64 is above the model's")
    assert not (tmp_path / "cache" / "convert").exists()


def test_mixing_guide_block_is_the_shipped_example():
    guide = (ROOT / "docs" / "mixing.md").read_text()
    block = re.search(r"# Mixing sources.*?```yaml\n(.*?)```", guide, flags=re.S)
    assert block and block.group(1) == (ROOT / "examples" / "mix.yaml").read_text()


@pytest.mark.slow
def test_an_unreadable_source_is_named_with_the_readable_fix_not_the_writable_one(tmp_path):
    """A source file moai may not read: one line saying to make it readable (the cache is fine).
    As root, permissions are checked only without the capabilities that bypass them (setpriv)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    data = tmp_path / "examples" / "data" / "part-1.jsonl"
    data.chmod(0)
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop root's permission bypass"
        drop = "-dac_override,-dac_read_search"
        prefix = [setpriv, "--bounding-set", drop, "--inh-caps", drop]
    out = subprocess.run(
        [*prefix, PYTHON, "-m", "moai.cli", "prepare", "examples/quickstart.yaml", "--no-progress"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(),
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("moai: error: permission denied: examples/data/part-1.jsonl: moai cannot read"), line
    assert "chmod a+r examples/data/part-1.jsonl" in line and "writable" not in line


def test_a_smaller_vocabulary_and_an_empty_validation_split_are_warned_on_every_run(tmp_path, corpus, capsys):
    """Built: logged as the stage runs; reused: said again after the table, as `moai: warning:`."""
    from moai.config import parse_config
    from moai.stages.tokenizer import vocab_warnings

    data = config_dict(tmp_path, corpus, {"train": {"vocab_size": 5000}}, pack={"seq_len": 4096})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    assert main(["prepare", str(cfg), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prepare", str(cfg), "--no-progress"]) == 0  # every stage reused
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("moai: warning: ")]
    assert len(warnings) == 2, warnings
    assert re.match(
        r"moai: warning: tokenizer\.train\.vocab_size 5,000 asked, [\d,]+ trained: .* min_frequency", warnings[0]
    )
    assert "0 validation samples and training evaluates nothing" in warnings[1]
    assert vocab_warnings(parse_config(data).tokenizer.train, {"vocab_size": 5000, "documents": 1}) == []
