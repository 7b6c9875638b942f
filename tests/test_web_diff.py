"""The diff page's heat strip shows the model on the model's own scale: the optimizer's
moments (which move far more than the weights) are summed up beside it, as ``mvc diff
--stat`` does, not drawn on one scale with the weights."""

import html
import re

import torch

from mvc.web import svg
from web_fixtures import fetch, served


def _state(scale: float, moment: float) -> dict:
    return {"model": {"layers": {"0": {"weight": torch.full((16,), 1.0 * scale)},
                                 "1": {"weight": torch.full((16,), 1.0 + (scale - 1.0) / 2)}}},
            "optimizer": {"state": {0: {"exp_avg": torch.full((16,), moment)}}, "param_groups": [{"lr": 0.1}]}}


def test_the_strip_scales_the_model_by_its_own_changes_and_sums_up_the_optimizer(repo):
    repo.commit(_state(1.0, 1.0), "a")
    repo.commit(_state(1.01, 4.3), "b")  # weights move 1% and 0.5%; Adam's exp_avg 330%
    with served(repo.root) as server:
        status, _, body = fetch(server.url.rstrip("/") + "/diff?a=HEAD~1")
    page = body.decode()
    assert status == 200
    cells = {layer: fill for fill, layer in re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"[^>]*data-layer="([^"]+)"',
                                                        page)}
    assert set(cells) == {"model.layers.0", "model.layers.1"}  # no optimizer cell on the model's scale
    assert cells["model.layers.0"] == svg.heat(1.0)  # the model's largest change is the darkest
    assert cells["model.layers.1"] == svg.heat(0.5)
    legend = html.unescape(re.search(r"<p class=muted id=strip-legend>(.*?)</p>", page)[1])
    assert legend.startswith("2 layers of the model (2 tensors) in model order")
    assert "against the model's largest (0.00999999, the darkest)" in legend  # float32's 1.01 - 1
    line = html.unescape(re.search(r'<li data-section="optimizer">(.*?) · <a', page)[1])
    assert line.startswith("optimizer state: 1 tensor, 1 changed;") and "largest ‖B−A‖/‖A‖ 3.3" in line


def test_a_section_s_link_lists_its_tensors(repo):
    repo.commit(_state(1.0, 1.0), "a")
    repo.commit(_state(1.01, 4.3), "b")
    with served(repo.root) as server:
        base = server.url.rstrip("/")
        page = fetch(base + "/diff?a=HEAD~1")[2].decode()
        link = re.search(r'<li data-section="optimizer">.*?<a href="([^"]+)">list them</a>', page)[1]
        listed = fetch(base + html.unescape(link))[2].decode()
    assert re.findall(r'<tr data-key="([^"]+)"', listed) == ["optimizer.state.0.exp_avg"]


def test_the_summary_says_what_happened_to_the_tensors_that_differ(repo):
    repo.commit(_state(1.0, 1.0), "with the optimizer")
    repo.commit({"model": _state(1.01, 1.0)["model"]}, "the model alone")
    with served(repo.root) as server:
        page = fetch(server.url.rstrip("/") + "/diff?a=HEAD~1")[2].decode()
    summary = html.unescape(re.search(r"<p id=summary>(.*?)</p>", page)[1])
    assert summary.startswith("3 of 3 tensors differ (2 changed, 1 removed); ")
    assert html.unescape(re.search(r'<li data-section="optimizer">(.*?) · <a', page)[1]).startswith(
        "optimizer state: 1 tensor, 1 removed; 64 B removed")
