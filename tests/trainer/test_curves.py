"""Training curves (trainer/curves.py), the TensorBoard mirror (trainer/tensorboard_log.py) and the
MetricsLog hook that feeds it, from metrics rows written here in the shapes the trainer writes."""

from __future__ import annotations

import importlib
import json
import math
import struct
import sys
import warnings
from pathlib import Path

import pytest

from tests.trainer.runs import optd_rows, optd_train, sft_rows, sft_train, write_rows, write_run
from trainer.curves import (
    checkpoint_run,
    plot_training_curves,
    read_rows,
    teacher_checkpoint,
    training_summary,
    write_training_curves,
)
from trainer.loop import MetricsLog
from trainer.tensorboard_log import TensorBoardMirror, scalars, tensorboard_mirrors

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SFT_TITLES = ["Training and held-out loss", "Sampled held-out responses"]
OPTD_TITLES = [
    "Training and held-out objective",
    "Sampled held-out responses",
    "Distillation: JSD to the trust-region target",
    "Grounding: NLL of the gold response",
    r"Trust region: guidance weight $\lambda^*$ and where the bound binds",
    r"Guidance KL: $\mathrm{KL}(q^{\lambda^*} \,\|\, q^0)$, mean over tokens",
]


def lines(figure):
    """Every labelled line of the figure: label -> (x, y), and which panel it is on."""
    found = {}
    for index, axes in enumerate(figure.axes):
        for line in axes.get_lines():
            if not line.get_label().startswith("_"):
                found[line.get_label()] = (list(line.get_xdata()), list(line.get_ydata()), index)
    return found


def same(values, expected):
    """Equal, a None in ``expected`` standing for the gap (NaN) the plot leaves."""
    assert len(values) == len(expected)
    for value, want in zip(values, expected, strict=True):
        assert math.isnan(value) if want is None else value == pytest.approx(want)


def png_size(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return struct.unpack(">II", data[16:24])  # IHDR: width, height


def test_sft_figure_has_the_loss_and_share_panels_with_the_rows_values():
    figure = plot_training_curves(sft_rows(), "sft")
    assert [axes.get_title(loc="left") for axes in figure.axes] == SFT_TITLES
    assert all(axes.get_xlabel() == "update" for axes in figure.axes)
    drawn = lines(figure)
    assert set(drawn) == {"training loss", "held-out loss", "parse share",
                          "executable share (of those judged on a screen)"}  # fmt: skip
    steps, values, panel = drawn["training loss"]
    assert (steps, panel) == ([1, 2, 3, 4], 0)
    same(values, [5.9, 4.1, 3.2, 2.7])
    steps, values, panel = drawn["held-out loss"]
    assert (steps, panel) == ([0, 2, 4], 0)
    same(values, [6.0, 4.5, 3.0])
    same(drawn["parse share"][1], [0.0, 0.5, 0.75])
    # nothing was judged at step 0: no executable share there, a gap rather than a zero
    same(drawn["executable share (of those judged on a screen)"][1], [None, 0.25, 0.5])
    # the shares' axis is the unit interval whatever the values (a little margin for whole markers)
    low, high = figure.axes[1].get_ylim()
    assert low < 0 < 1 < high < 1.1


def test_the_sft_training_line_is_the_responses_nll_where_the_loss_adds_the_screen_id_part():
    # with screen_id_weight an update's loss is the responses' NLL plus the screen-id states' sum:
    # the line beside the held-out loss is the NLL, on the held-out loss's scale, as written per update
    rows = [{**row, "loss": row["nll"] + 40.0, "screen_id": 40.0} if row["kind"] == "train" else row
            for row in sft_rows()]  # fmt: skip
    steps, values, _ = lines(plot_training_curves(rows, "sft"))["training loss"]
    assert steps == [1, 2, 3, 4]
    same(values, [5.9, 4.1, 3.2, 2.7])


def test_held_out_points_carry_markers_and_every_panel_a_legend_beside_it():
    figure = plot_training_curves(sft_rows(), "sft")
    for axes in figure.axes:
        legend = axes.get_legend()
        assert legend is not None
        # anchored at the right edge of the axes (x = 1.01 in axes coordinates): outside the lines
        assert legend.get_bbox_to_anchor().transformed(axes.transAxes.inverted()).x0 == pytest.approx(1.01)
    held_out = [line for line in figure.axes[0].get_lines() if line.get_label() == "held-out loss"]
    assert held_out[0].get_marker() == "o"
    # two shares of equal value (both 0 early in a run) stay both visible: a smaller diamond in the circle
    parse, executable = figure.axes[1].get_lines()
    assert (parse.get_marker(), executable.get_marker()) == ("o", "D")
    assert executable.get_markersize() < parse.get_markersize()


def test_optd_figure_adds_the_parts_the_trust_region_and_the_guidance_kl():
    figure = plot_training_curves(optd_rows(), "optd")
    assert [axes.get_title(loc="left") for axes in figure.axes] == OPTD_TITLES
    drawn = lines(figure)
    # the OPTD eval rows name the held-out loss "objective"
    same(drawn["held-out loss"][1], [0.3, 0.18])
    same(drawn["training loss"][1], [0.25 + 0.1 * 1.0, 0.15 + 0.1 * 0.9])
    for label, panel, train, held_out in [
        ("distillation", 2, [0.25, 0.15], [0.2, 0.1]),
        ("grounding", 3, [1.0, 0.9], [1.0, 0.8]),
        (r"mean $\lambda^*$", 4, [0.5, 0.6], [0.5, 0.7]),
        (r"binding share ($\lambda^* < \lambda_{max}$)", 4, [0.6, 0.5], [0.6, 0.4]),
        ("guidance KL", 5, [0.019, 0.017], [0.02, 0.015]),
    ]:
        assert drawn[label][0] == [1, 2] and drawn[label][2] == panel
        same(drawn[label][1], train)
        assert drawn[f"held-out {label}"][0] == [0, 2] and drawn[f"held-out {label}"][2] == panel
        same(drawn[f"held-out {label}"][1], held_out)
    low, high = figure.axes[4].get_ylim()  # mean lambda* and binding share are in 0..1
    assert low < 0 < 1 < high < 1.1


def test_a_held_out_loss_named_held_out_loss_is_drawn_for_optd_too():
    # the eval rows may name it held_out_loss (and carry no parts): the same line, no held-out parts
    rows = [{"kind": "eval", "step": 0, "held_out_loss": 0.4, "parse_share": 1.0, "executable_share": 1.0},
            optd_train(1, 0.25, 1.0, 0.5, 0.6, 0.019)]  # fmt: skip
    drawn = lines(plot_training_curves(rows, "optd"))
    same(drawn["held-out loss"][1], [0.4])
    assert "held-out guidance KL" not in drawn and drawn["guidance KL"][0] == [1]


def test_a_skipped_update_is_a_gap_in_the_loss():
    rows = [sft_train(1, 3.0), {**sft_train(2, math.nan), "skipped": True}, sft_train(3, 2.0)]
    same(lines(plot_training_curves(rows, "sft"))["training loss"][1], [3.0, None, 2.0])


def test_a_single_row_draws_and_says_what_is_missing(tmp_path):
    figure = plot_training_curves([sft_train(1, 5.0)], "sft")
    same(lines(figure)["training loss"][1], [5.0])
    assert [t.get_text() for t in figure.axes[1].texts] == ["no held-out evaluation yet"]
    assert figure.axes[1].get_legend() is None
    # whole-number update ticks even over a single update
    assert all(tick == int(tick) for tick in figure.axes[0].get_xticks())
    path = tmp_path / "one.png"
    figure.savefig(path, format="png", dpi=100)
    assert png_size(path) == (1100, 640)  # 11 in x (0.6 + 2 x 2.9) in at 100 dpi


def test_the_checkpoint_scored_is_marked_on_every_panel():
    figure = plot_training_curves(sft_rows(), "sft", mark_step=2)
    marks = [[line for line in axes.get_lines() if line.get_linestyle() == ":"] for axes in figure.axes]
    assert [[list(line.get_xdata()) for line in found] for found in marks] == [[[2, 2]], [[2, 2]]]
    assert marks[0][0].get_label() == "evaluated checkpoint (update 2)"
    assert marks[1][0].get_label().startswith("_")  # named once, in the first panel's legend
    teacher = plot_training_curves(sft_rows(), "sft", mark_step=4, mark_label="teacher checkpoint")
    assert "teacher checkpoint (update 4)" in lines(teacher)


def test_write_training_curves_writes_a_png_per_stage(tmp_path):
    write_rows(tmp_path / "sft", sft_rows())
    write_rows(tmp_path / "optd", optd_rows())
    sft_png, optd_png = write_training_curves(tmp_path / "sft"), write_training_curves(tmp_path / "optd")
    assert sft_png == tmp_path / "sft" / "curves.png"
    assert png_size(sft_png) == (1100, 640)
    # the OPTD rows are recognised by their parts: six panels, (0.6 + 6 x 2.9) in at 100 dpi
    assert png_size(optd_png) == (1100, 1800)
    assert sorted(p.name for p in (tmp_path / "sft").iterdir()) == ["curves.png", "metrics.jsonl"]


def test_write_training_curves_without_rows_writes_nothing(tmp_path):
    assert write_training_curves(tmp_path) is None  # no metrics.jsonl
    write_rows(tmp_path, [])
    assert write_training_curves(tmp_path) is None
    assert not (tmp_path / "curves.png").exists()


def test_a_line_cut_off_by_the_writer_is_left_out(tmp_path):
    path = write_rows(tmp_path, sft_rows()[:2])
    path.write_text(path.read_text() + '{"kind": "train", "st')
    assert read_rows(tmp_path) == sft_rows()[:2]
    assert write_training_curves(tmp_path) == tmp_path / "curves.png"


def test_the_trainer_modules_import_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None in sys.modules: the import fails
    for name in ("trainer.curves", "trainer.tensorboard_log", "trainer.loop"):
        monkeypatch.delitem(sys.modules, name)
        importlib.import_module(name)
    with pytest.raises(ImportError):
        sys.modules["trainer.curves"].plot_training_curves(sft_rows(), "sft")


# --- the run behind a checkpoint ----------------------------------------------------------------


def test_a_trajforge_checkpoint_leads_to_its_run_and_a_model_folder_to_none(tmp_path):
    checkpoint = write_run(tmp_path / "run", sft_rows(), "sft", 4)
    assert checkpoint_run(checkpoint) == tmp_path / "run"
    plain = tmp_path / "model"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert checkpoint_run(plain) is None
    (checkpoint.parent.parent / "metrics.jsonl").unlink()  # the layout, but no metrics beside it
    assert checkpoint_run(checkpoint) is None


@pytest.mark.parametrize("meta_in", ["checkpoint", "trainer_state"])
def test_the_teacher_is_read_from_trainer_json_in_either_place(tmp_path, meta_in):
    teacher = tmp_path / "sft" / "checkpoints" / "step-000004"
    checkpoint = write_run(tmp_path / "optd", optd_rows(), "optd", 2, meta_in=meta_in, teacher=str(teacher))
    assert teacher_checkpoint(tmp_path / "optd", checkpoint) == teacher


def test_the_teacher_is_read_from_the_summary_and_an_sft_run_has_none(tmp_path):
    checkpoint = write_run(tmp_path / "optd", optd_rows(), "optd", 2)
    assert teacher_checkpoint(tmp_path / "optd", checkpoint) is None
    (tmp_path / "optd" / "summary.json").write_text(json.dumps({"steps": 2, "teacher": "/runs/sft/step"}))
    assert str(teacher_checkpoint(tmp_path / "optd", checkpoint)) == "/runs/sft/step"


def test_the_summary_is_the_first_and_last_evaluation():
    summary = training_summary(Path("/r"), sft_rows(), "sft")
    assert summary == {
        "run_dir": "/r", "stage": "sft", "steps": 4,
        "held_out_loss_start": 6.0, "held_out_loss_end": 3.0,
        "parse_share_start": 0.0, "parse_share_end": 0.75,
        "executable_share_start": None, "executable_share_end": 0.5,  # nothing judged at the start
    }  # fmt: skip
    optd = training_summary(Path("/r"), optd_rows(), "optd")
    assert (optd["held_out_loss_start"], optd["held_out_loss_end"], optd["steps"]) == (0.3, 0.18, 2)


# --- TensorBoard ----------------------------------------------------------------------------------


class Recording:
    def __init__(self):
        self.rows, self.closed = [], False

    def write(self, row):
        self.rows.append(row)

    def close(self):
        self.closed = True


def test_metrics_log_hands_every_row_to_its_mirrors_after_the_file(tmp_path):
    mirror = Recording()
    log = MetricsLog(tmp_path / "metrics.jsonl", mirrors=[mirror])
    for row in sft_rows()[:3]:
        log.write(row)
    assert mirror.rows == sft_rows()[:3] == log.rows()
    log.close()
    assert mirror.closed


def test_metrics_log_without_mirrors_keeps_its_resume_behaviour(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for row in sft_rows():
        log.write(row)
    # resumed after update 2: the rows of steps 3 and 4 (two train rows, one eval row) are dropped
    assert MetricsLog(tmp_path / "metrics.jsonl", resume_from=2).rows() == sft_rows()[:4]
    log.close()  # no mirrors: nothing to close, no error


def test_scalars_are_tagged_by_kind_and_a_missing_value_is_left_out():
    eval_row = sft_rows()[0]
    assert scalars(eval_row) == {"eval/held_out_loss": 6.0, "eval/parse_share": 0.0, "eval/judged": 0.0}
    train = scalars(sft_train(1, 5.9))
    assert train["train/loss"] == 5.9 and train["train/seconds/forward_backward"] == 0.2
    assert train["train/skipped"] == 0.0 and "train/step" not in train


def tensorboard_available():
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return False
    return True


needs_tensorboard = pytest.mark.skipif(not tensorboard_available(), reason="tensorboard is not installed")


def read_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return events


def scalar_series(events, tag):
    return [(e.step, e.value) for e in events.Scalars(tag)]


@needs_tensorboard
def test_tensorboard_events_are_written_and_read_back(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", mirrors=tensorboard_mirrors(tmp_path))
    for row in optd_rows():
        log.write(row)
    log.close()
    events = read_events(tmp_path)
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/mean_lambda", "train/binding_share", "train/guidance_kl",
            "train/seconds/generate", "eval/objective", "eval/parse_share", "eval/executable_share",
            "eval/rejected/unknown_item"} <= tags  # fmt: skip
    # float32 in the event file: equal to the rows' values to float32 precision
    assert scalar_series(events, "train/mean_lambda") == [(1, pytest.approx(0.5)), (2, pytest.approx(0.6))]
    assert scalar_series(events, "eval/parse_share") == [(0, pytest.approx(0.5)), (2, pytest.approx(1.0))]


@needs_tensorboard
def test_tensorboard_held_out_loss_tag_and_a_missing_share_left_out(tmp_path):
    mirror = TensorBoardMirror(tmp_path)
    for row in sft_rows():
        mirror.write(row)
    mirror.close()
    events = read_events(tmp_path)
    assert scalar_series(events, "eval/held_out_loss") == [(0, 6.0), (2, 4.5), (4, 3.0)]
    # no executable share at step 0 (nothing judged): the series starts at step 2
    assert [step for step, _ in scalar_series(events, "eval/executable_share")] == [2, 4]


@needs_tensorboard
def test_a_resumed_run_replaces_the_events_after_its_restart_and_a_fresh_run_starts_clean(tmp_path):
    first = TensorBoardMirror(tmp_path)
    for step, loss in [(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.0)]:
        first.write(sft_train(step, loss))
    first.close()
    resumed = TensorBoardMirror(tmp_path, resume_from=2)  # as MetricsLog: steps after 2 are redone
    for step, loss in [(3, 3.5), (4, 2.5)]:
        resumed.write(sft_train(step, loss))
    resumed.close()
    assert scalar_series(read_events(tmp_path), "train/loss") == [(1, 5.0), (2, 4.0), (3, 3.5), (4, 2.5)]
    fresh = TensorBoardMirror(tmp_path)  # a new run in the same folder
    fresh.write(sft_train(1, 9.0))
    fresh.close()
    assert scalar_series(read_events(tmp_path), "train/loss") == [(1, 9.0)]


def test_without_tensorboard_the_mirror_is_a_no_op_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # None in sys.modules: import fails
    with pytest.warns(UserWarning, match="tensorboard is not installed") as caught:
        mirror = TensorBoardMirror(tmp_path)
    assert len(caught) == 1 and not mirror.available
    mirror.write(sft_rows()[0])  # written nowhere, no error
    mirror.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert tensorboard_mirrors(tmp_path) == ()
    log = MetricsLog(tmp_path / "metrics.jsonl", mirrors=())
    log.write(sft_rows()[0])
    assert log.rows() == sft_rows()[:1]
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("stage, rows", [("sft", sft_rows()), ("optd", optd_rows())])
def test_no_panel_legend_or_title_overlaps_another(stage, rows):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = plot_training_curves(rows, stage, mark_step=2)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)  # lays the figure out (constrained layout) as saving it does
    page = figure.bbox
    panels = [axes.get_tightbbox(renderer) for axes in figure.axes]  # ticks, labels, title, legend
    for i, first in enumerate(panels):
        assert page.x0 <= first.x0 and first.x1 <= page.x1 and page.y0 <= first.y0 and first.y1 <= page.y1
        assert not any(first.overlaps(other) for other in panels[i + 1 :])
    for axes in figure.axes:  # each legend outside the plotting area of its panel
        assert not axes.get_legend().get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))
