"""``share=i/k``: k processes side by side split a list of units with none measured twice or left out."""

import pytest

from heedful.errors import InputError
from heedful.evaluate.share import Share


@pytest.mark.parametrize("of", [1, 2, 3, 5])
def test_the_shares_of_k_processes_partition_the_units(of):
    shares = [Share.parse(f"{mine}/{of}") for mine in range(of)]
    owners = [[s for s in shares if s.takes(index)] for index in range(23)]
    assert all(len(o) == 1 for o in owners)
    assert [str(o[0]) for o in owners[:of]] == [f"{mine}/{of}" for mine in range(of)]


def test_no_share_is_every_unit():
    assert Share.parse(None) == Share.parse("") == Share(0, 1)
    assert all(Share().takes(i) for i in range(7))


@pytest.mark.parametrize(("text", "problem"), [("2/2", "i must be in 0..k-1"), ("-1/2", "i must be in 0..k-1"), ("1/0", "i must be in 0..k-1"), ("x", "is not i/k"), ("1/2/3", "is not i/k")])
def test_a_bad_share_is_one_line_naming_the_option_and_an_example(text, problem):
    with pytest.raises(InputError, match=problem) as caught:
        Share.parse(text, "--share")
    assert caught.value.message.startswith(f"--share {text!r}") and "\n" not in caught.value.message
    assert caught.value.hint == "e.g. --share 0/2 and --share 1/2 for two processes"


def test_an_option_spelled_with_equals_keeps_it_in_the_message(tmp_path):
    from heedful.reproduce import ReportSettings
    from heedful.reproduce import coperturbation as cp

    with pytest.raises(InputError, match=r"^share='x' is not i/k") as caught:
        cp.write(tmp_path, ReportSettings(options={"share": "x"}))
    assert caught.value.hint == "e.g. share=0/2 and share=1/2 for two processes"
