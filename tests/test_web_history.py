"""The web history answers "which checkpoint was best, and what changed since?": one column per
metric, sortable, the best value marked, "best by METRIC" links, and "compare with HEAD"."""

import html
import re

import torch

from web_fixtures import fetch, served


def _run(repo):
    losses = [3.1, 2.6, 2.2, 2.4, 2.25]
    return [repo.commit({"w": torch.full((4,), float(i))}, f"step {i}", step=100 * i,
                        metrics={"eval_loss": loss, "accuracy": 0.5 + i / 20}).id
            for i, loss in enumerate(losses)]


def _rows(page: str) -> list:
    return re.findall(r'<tr data-commit="([0-9a-f]+)"', page)


def test_history_has_sortable_metric_columns_with_the_best_marked_and_best_links(repo):
    ids = _run(repo)
    with served(repo.root) as server:
        base = server.url.rstrip("/")
        page = fetch(base + "/")[2].decode()
        heads = re.findall(r"<th>(.*?)</th>", page)
        assert any(">accuracy<" in h for h in heads) and any(">eval_loss<" in h for h in heads)
        assert page.count("★") == 2  # one best per metric: lowest loss, highest accuracy
        best_loss = re.search(r'<tr data-commit="([0-9a-f]+)"(?:(?!</tr>).)*?title="best eval_loss"', page, re.S)
        assert best_loss[1] == ids[2]
        link = re.search(r'<a href="([^"]+)" class="best"[^>]*>best by eval_loss</a>', page)
        assert html.unescape(link[1]) == f"/commit?rev={ids[2]}"
        by_loss = fetch(base + "/?sort=eval_loss")[2].decode()
        assert _rows(by_loss) == [ids[2], ids[4], ids[3], ids[1], ids[0]]
        by_acc = fetch(base + "/?sort=-accuracy")[2].decode()
        assert _rows(by_acc)[0] == ids[4]
        assert "/?sort=-eval_loss" in html.unescape(by_loss)  # its head now sorts the other way
        status, _, body = fetch(base + "/?sort=nosuch")
        assert status == 400 and b"nosuch" in body
        commit_page = fetch(base + f"/commit?rev={ids[2]}")[2].decode()
        compare = re.search(r'<a href="([^"]+)">compare with HEAD</a>', commit_page)
        assert html.unescape(compare[1]) == f"/diff?a={ids[2]}&b=HEAD"
        status, _, body = fetch(base + html.unescape(compare[1]))
        assert status == 200 and b"tensors differ" in body
        status, _, only_a = fetch(base + f"/diff?a={ids[2]}")  # B left out: HEAD, as 'mvc diff A'
        assert status == 200 and only_a == body


def test_every_metric_has_its_best_link_though_only_six_are_columns(repo):
    names = ["accuracy", "bleu", "epoch_time", "eval_acc", "eval_bleu", "eval_f1"]  # sort before eval_loss
    ids = [repo.commit({"w": torch.full((4,), float(i))}, f"step {i}", step=i,
                       metrics={"eval_loss": loss, **{n: float(i) for n in names}}).id
           for i, loss in enumerate([2.0, 1.5, 1.8])]
    with served(repo.root) as server:
        page = fetch(server.url.rstrip("/") + "/")[2].decode()
    assert not any(">eval_loss<" in h for h in re.findall(r"<th>(.*?)</th>", page))  # past the columns
    link = re.search(r'<a href="([^"]+)" class="best"[^>]*>best by eval_loss</a>', page)
    assert html.unescape(link[1]) == f"/commit?rev={ids[1]}"


def test_a_diff_shows_the_norms_by_default_within_a_budget(repo, monkeypatch):
    from mvc.web import pages
    _run(repo)
    with served(repo.root) as server:
        base = server.url.rstrip("/")
        page = fetch(base + "/diff?a=HEAD~1")[2].decode()
        assert "‖B−A‖/‖A‖" in page and "chunk ids only" in page
        assert "no tensor bytes were read" in fetch(base + "/diff?a=HEAD~1&numbers=0")[2].decode()
        monkeypatch.setattr(pages, "NORMS_BUDGET", 8)  # past the budget: chunk ids, and a link to ask
        page = fetch(base + "/diff?a=HEAD~1")[2].decode()
        assert "no tensor bytes were read" in page and "Compute the norms" in page


def test_storage_says_the_saving_against_one_torch_save_per_checkpoint(repo):
    frozen = torch.arange(4096, dtype=torch.float32)  # 16 KiB every checkpoint shares
    for i in range(4):
        repo.commit({"frozen": frozen, "head": torch.full((16,), float(i))}, f"c{i}")
    whole = 4 * (16384 + 64)
    with served(repo.root) as server:
        page = fetch(server.url.rstrip("/") + "/storage")[2].decode()
    table_html = page[page.index('id=saving'):page.index("</table>", page.index('id=saving'))]
    cells = re.findall(r"<td>(.*?)</td>", table_html)
    facts = dict(zip(cells[::2], cells[1::2]))
    assert facts["<b>checkpoints kept</b>"] == "4"
    assert facts["<b>one torch.save each</b>"] == "64.2 KiB of tensor data" and whole == 65792
    assert "× smaller" in facts["<b>saving</b>"]


def test_a_branch_s_curve_has_its_history_lane_s_colour(repo):
    for i in range(3):
        repo.commit({"w": torch.full((4,), float(i))}, f"m{i}", step=i, metrics={"loss": 3.0 - i})
    repo.create_branch("exp", "HEAD~1")
    repo.checkout("exp")
    for i in range(2):
        repo.commit({"w": torch.full((4,), 10.0 + i)}, f"e{i}", step=10 + i, metrics={"loss": 2.5 - i})
    repo.checkout("main")
    repo.commit({"w": torch.full((4,), 20.0)}, "m3", step=3, metrics={"loss": 0.5})  # main newest: lane 0
    tips = {b.name: b.id for b in repo.branches()}  # exp first by name, though its lane is the second
    with served(repo.root) as server:
        base = server.url.rstrip("/")
        history = fetch(base + "/")[2].decode()
        chart = fetch(base + "/curves?metric=loss")[2].decode()
    for name, tip in tips.items():
        row = re.search(rf'<tr data-commit="{tip}">.*?</tr>', history, re.S)[0]
        node = re.search(r'<circle[^>]*class="node"[^>]*>|<circle[^>]*fill="(#[0-9a-f]+)"[^>]*class="node"', row)
        lane_colour = re.search(r'fill="(#[0-9a-f]{6})"', node[0])[1]
        line = re.search(rf'<g class="series" data-series="{name}"><polyline[^>]*stroke="(#[0-9a-f]{{6}})"', chart)
        assert line[1] == lane_colour, name
