"""pykittens.bench.timeline.chart: a PNG of spans on their compute units' rows; bad spans
are refused with the reason."""
import pytest

from pykittens.bench.timeline import PALETTE, Span, chart


def test_a_chart_of_spans_is_a_png(tmp_path):
    spans = [Span(u, 1.0 + u, 5.0 + 2 * u, "walk") for u in range(6)] + \
            [Span(u, 5.0 + 2 * u, 5.5 + 2 * u, "store") for u in range(6)]
    path = tmp_path / "t.png"
    chart(spans, "six units", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("spans, why", [
    ([], "at least one span"),
    ([Span(0, 2.0, 1.0, "x")], "ends before it starts"),
    ([Span(0, 0.0, 1.0, str(i)) for i in range(len(PALETTE) + 1)], "at most"),
])
def test_bad_spans_are_refused(tmp_path, spans, why):
    with pytest.raises(ValueError, match=why):
        chart(spans, "bad", str(tmp_path / "t.png"))
