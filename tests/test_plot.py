"""mvc.plot: diff and metric pictures, and the message when matplotlib is missing."""

import sys

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc import plot
from mvc.errors import MetricNotRecorded
from mvc.cli import main
from conftest import run_cli as cli

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def history(repo):
    """Five commits of a 12-layer model whose deeper layers change more."""
    state = {f"model.layers.{i}.{n}": torch.ones(16) for i in range(12) for n in ("w", "b")}
    state["model.embed.weight"] = torch.ones(8)
    for step in range(5):
        state = {k: v + (0.01 * int(k.split(".")[2]) if ".w" in k and "layers" in k else 0)
                 for k, v in state.items()}
        repo.commit(state, f"step {step}", step=100 * step, metrics={"loss": 2.0 / (step + 1)})
    return repo




def test_plot_diff_writes_png(history, tmp_path):
    pytest.importorskip("matplotlib")
    d = history.diff("HEAD~4")
    out = plot.plot_diff(d, tmp_path / "diff.png")
    assert out == tmp_path / "diff.png" and out.read_bytes().startswith(PNG)
    grouped = plot.plot_diff(d, tmp_path / "layers.png", max_rows=5)
    assert grouped.read_bytes().startswith(PNG)


def test_rows_per_tensor_or_per_layer_in_model_order(history):
    d = history.diff("HEAD~4")
    rows = plot._rows(d, plot.MAX_ROWS)
    assert len(rows) == 25 and rows[0][0] == "model.embed.weight"
    labels = [label for label, _, _ in plot._rows(d, max_rows=5)]
    assert labels == ["model.embed"] + [f"model.layers.{i}" for i in range(12)]
    by_label = {label: (value, status) for label, value, status in plot._rows(d, max_rows=5)}
    assert by_label["model.layers.0"] == (0.0, "unchanged")
    w11 = next(t for t in d.tensors if t.key == "model.layers.11.w")
    # w moved, b (as many bytes) did not: the layer's change is their byte-weighted mean
    assert by_label["model.layers.11"] == (pytest.approx(w11.relative_change / 2), "changed")


def test_a_small_bias_does_not_stand_for_its_layer(repo):
    torch.manual_seed(0)
    a = {f"layers.{i}.{n}": torch.randn(*shape) for i in range(3) for n, shape in (("w", (64, 64)), ("b", (64,)))}
    b = dict(a)
    b["layers.1.w"] = a["layers.1.w"] * 1.03  # the weights barely move
    b["layers.1.b"] = a["layers.1.b"] * 3.78  # a tiny bias moves a lot
    repo.commit(a)
    repo.commit(b)
    rows = {label: value for label, value, _ in plot._rows(repo.diff("HEAD~1"), max_rows=2)}
    assert rows["layers.1"] == pytest.approx((0.03 * 64 * 64 + 2.78 * 64) / (64 * 64 + 64), rel=1e-4)
    assert rows["layers.1"] < 0.1 and rows["layers.0"] == 0.0


def test_layer_of():
    assert plot.layer_of("model.layers.12.attn.q.weight") == "model.layers.12"
    assert plot.layer_of("model.embed.weight") == "model.embed"
    assert plot.layer_of("bias") == "bias"


def test_plot_metric(history, tmp_path):
    pytest.importorskip("matplotlib")
    out = plot.plot_metric(history.log(), "loss", tmp_path / "loss.png")
    assert out.read_bytes().startswith(PNG)
    with pytest.raises(MetricNotRecorded) as err:
        plot.plot_metric(history.log(), "accuracy", tmp_path / "acc.png")
    assert (err.value.metric, err.value.recorded) == ("accuracy", ("loss",))


def test_the_diff_plot_s_title_says_what_happened_to_the_tensors(repo, tmp_path):
    pytest.importorskip("matplotlib")
    repo.commit({"model": {"w": torch.ones(4)}, "optimizer": {"m": torch.ones(4), "v": torch.ones(4)}}, "parent")
    repo.commit({"model": {"w": torch.zeros(4)}}, "model only")
    drawn = plot.plot_diff(repo.diff("HEAD~1"), tmp_path / "diff.svg").read_text()
    title = next(line.strip() for line in drawn.splitlines() if "tensors" in line)  # svg keeps text as a comment
    assert title.endswith(": 3 of 3 tensors differ (1 changed, 2 removed), 100% of parameters -->")


def test_cli_diff_plot(history, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "cli.png"
    out = cli(history, "diff", "HEAD~4", "--plot", str(target))
    assert out.exit_code == 0, out.output
    assert target.read_bytes().startswith(PNG)
    assert "11 of 25 tensors changed" in out.output  # layer 0 moves by 0
    inside = history.dir / "plot.png"
    out = cli(history, "diff", "HEAD~4", "--plot", str(inside))  # mvc never writes into .mvc
    assert out.exit_code == 1 and "inside the repository" in out.output and not inside.exists()


def test_without_matplotlib_plot_says_how_to_install(history, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes 'import matplotlib' fail
    with pytest.raises(mvc.errors.MissingExtra) as exc:
        plot.plot_diff(history.diff("HEAD~1"), tmp_path / "x.png")
    assert (exc.value.package, exc.value.extra) == ("matplotlib", "plot")
    target = tmp_path / "cli.png"
    out = cli(history, "diff", "HEAD~1", "--plot", str(target))
    assert out.exit_code == 1
    assert out.output == "mvc: error: plotting needs matplotlib, which is not installed; " \
                         "install it with: pip install 'mvc-checkpoints[plot]'\n"
    assert not target.exists()


def test_cli_log_plot(history, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "loss.png"
    out = CliRunner().invoke(main, ["-C", str(history.root), "log", "--oneline", "--plot", "loss", str(target)])
    assert out.exit_code == 0, out.output
    assert target.read_bytes().startswith(PNG)
    assert len(out.stdout.splitlines()) == 5  # the log itself is still printed
    bad = cli(history, "log", "--plot", "bleu", str(tmp_path / "bleu.png"))
    assert bad.exit_code == 1 and "no commit records metric 'bleu'" in bad.stderr


def test_cli_log_plot_without_matplotlib(history, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = cli(history, "log", "--plot", "loss", str(tmp_path / "loss.png"))
    assert out.exit_code == 1
    assert out.stderr.count("\n") == 1 and "pip install 'mvc-checkpoints[plot]'" in out.stderr and out.stdout == ""
