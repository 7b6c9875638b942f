"""What a user types into the web view's boxes and gets wrong is said beside the box, on a page
that keeps the form to fix it (as ``mvc log --where`` says it at the terminal), never an empty
listing or a page of its own."""

import html
import re

import torch

from web_fixtures import fetch, served


def _run(repo, branch=None):
    for i, loss in enumerate([3.1, 2.6, 2.2]):
        repo.commit({"w": torch.full((4,), float(i))}, f"step {i}", step=i, branch=branch,
                    metrics={"eval_loss": loss, "loss": loss + 0.1})


def _box(page: str, name: str) -> str:
    """The label holding input ``name``: its input and what is said beside it."""
    return re.search(rf'<label>[^<]*<input name={name} .*?</label>', page, re.S)[0]


def test_a_mistyped_metric_in_the_record_filter_is_named_beside_the_box(repo):
    _run(repo)
    with served(repo.root) as server:
        status, _, body = fetch(server.url.rstrip("/") + "/?where=eval_los%3C0.3")
    page = body.decode()
    assert status == 200
    said = html.unescape(re.search(r'<span class=err id=where-error role=alert>(.*?)</span>', _box(page, "where"))[1])
    assert said == "no commit here records metric 'eval_los'; recorded: eval_loss, loss"
    assert 'value="eval_los&lt;0.3"' in _box(page, "where")  # kept, to be fixed
    assert 'class="log"' not in page and "commits 0" not in page  # no empty listing that reads as "none qualify"


def test_a_malformed_or_hostile_filter_is_said_escaped_and_the_form_kept(repo):
    _run(repo)
    with served(repo.root) as server:
        base = server.url.rstrip("/")
        for where, said in [("loss%3C%3C2", "filter 'loss<<2': '<2' is not a number"),
                            ("%3Cscript%3Ex%3C/script%3E%3C1", "filter '<script>x</script><1'")]:
            status, _, body = fetch(base + "/?where=" + where)
            page = body.decode()
            assert status == 200 and "<button type=submit>Show</button>" in page
            error = re.search(r'<span class=err id=where-error role=alert>(.*?)</span>', page)[1]
            assert html.unescape(error).startswith(said)
            assert "<script>" not in page.split("</head>")[1]
        status, _, body = fetch(base + "/?where=loss%3C2.75")  # a good filter still lists what meets it
        assert status == 200 and len(re.findall(r'<tr data-commit=', body.decode())) == 2
        body = fetch(base + "/?where=loss%3C0.01")[2].decode()
        assert "No commit here meets loss&lt;0.01." in body


def test_a_range_naming_a_missing_branch_is_said_beside_the_box(repo):
    _run(repo, branch="trunk")  # no branch main
    with served(repo.root) as server:
        base = server.url.rstrip("/")
        status, _, body = fetch(base + "/?range=main~3..main")
        page = body.decode()
        assert status == 200
        box = _box(page, "range")
        assert 'value="main~3..main"' in box and "aria-invalid=true" in box
        said = html.unescape(re.search(r'<span class=err id=range-error role=alert>(.*?)</span>', box)[1])
        assert "'main" in said and 'class="log"' not in page
        status, _, body = fetch(base + "/?range=trunk")  # no '..': said the same way
        assert status == 200 and b"write it as A..B" in body and b"id=range-error" in body
        status, _, body = fetch(base + "/?range=trunk~2..trunk")
        assert status == 200 and len(re.findall(r'<tr data-commit=', body.decode())) == 2
