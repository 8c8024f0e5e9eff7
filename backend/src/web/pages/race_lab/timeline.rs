//! Every answer of a run on one time axis, one lane per stage: where each
//! answer's mark goes, the axis's round-numbered ticks, and the cooldown
//! window's shading.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::race_lab::burst::Answer;
use crate::race_lab::presets::Stage;
use crate::web::money;

use super::answers::{how_it_ended, milliseconds};

/// Every answer on one time axis, one lane per stage. Marks are drawn in
/// SVG (the page's policy allows no inline styles), words in HTML, so that
/// the text keeps its size on a phone while the drawing scales.
#[derive(Serialize, Deserialize)]
pub(super) struct Timeline {
    /// The drawing's width in SVG units; the axis runs from 0 to it.
    pub(super) width: u32,
    pub(super) lanes: Vec<Lane>,
    /// Axis labels at 0, ¼, ½, ¾ and the whole of the axis.
    pub(super) ticks: Vec<String>,
    /// The x of each tick line.
    pub(super) tick_xs: Vec<u32>,
    /// The cooldown window from the first request, when the cooldown was
    /// on: its right edge in SVG units (the axis width when the window
    /// outlasts the run), and a sentence saying what the shading is.
    pub(super) window_x: Option<u32>,
    pub(super) window_note: String,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Lane {
    pub(super) label: String,
    pub(super) class: String,
    pub(super) count: usize,
    /// The lane's height in SVG units: its tallest column of marks.
    pub(super) height: u32,
    pub(super) marks: Vec<Mark>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Mark {
    pub(super) x: u32,
    pub(super) y: u32,
    /// `circle`, `square` or `diamond`: moved, refused or replayed.
    pub(super) shape: String,
    pub(super) title: String,
}

impl Timeline {
    /// The axis in SVG units: `COLUMNS` columns of `STEP` each. 32 columns
    /// keep a mark at least 8 px wide on a 390 px phone, large enough to
    /// tap.
    const COLUMNS: u32 = 32;
    const STEP: u32 = 10;
    /// Marks one column holds before the next go to the nearest column
    /// with room: a dense moment spreads sideways a little rather than
    /// growing a lane taller than a screen. 32 columns of 10 hold 320
    /// marks, more than the largest run.
    const STACK_MAX: u32 = 10;

    /// One lane per stage that any answer reached; x is the moment the
    /// answer came, since the burst; one mark per request, stacked, so
    /// that every mark can be counted at any N.
    pub(super) fn of(
        answers: &[Answer],
        label: &dyn Fn(Stage) -> String,
        cooldown_window: Option<Duration>,
    ) -> Self {
        let last = answers
            .iter()
            .map(|answer| answer.answered)
            .max()
            .unwrap_or(Duration::ZERO);
        let axis_ms = nice_axis_ms(last.as_secs_f64() * 1000.0);
        let width = Self::COLUMNS * Self::STEP;
        let column_of = |at: Duration| {
            let fraction = (at.as_secs_f64() * 1000.0 / axis_ms).clamp(0.0, 1.0);
            ((fraction * f64::from(Self::COLUMNS)) as u32).min(Self::COLUMNS - 1)
        };
        let lanes = Stage::ALL
            .into_iter()
            .filter_map(|stage| Lane::of(stage, answers, label, &column_of))
            .collect();
        let quarter = axis_ms / 4.0;
        let (window_x, window_note) = match cooldown_window {
            None => (None, String::new()),
            Some(window) => cooldown_shading(window, axis_ms, width),
        };
        Self {
            width,
            lanes,
            ticks: (0..=4).map(|i| axis_label(quarter * f64::from(i))).collect(),
            tick_xs: (0..=4).map(|i| width * i / 4).collect(),
            window_x,
            window_note,
        }
    }
}

impl Lane {
    /// The lane of the answers that stopped at `stage`, each in the column
    /// `column_of` its moment, or the nearest with room; `None` when no
    /// answer stopped there.
    fn of(
        stage: Stage,
        answers: &[Answer],
        label: &dyn Fn(Stage) -> String,
        column_of: &impl Fn(Duration) -> u32,
    ) -> Option<Self> {
        let mut heights = vec![0u32; Timeline::COLUMNS as usize];
        let marks: Vec<Mark> = answers
            .iter()
            .enumerate()
            .filter(|(_, answer)| Stage::of(answer) == stage)
            .map(|(index, answer)| {
                let column =
                    nearest_column_with_room(&heights, column_of(answer.answered), Timeline::STACK_MAX);
                let level = heights[column];
                heights[column] += 1;
                Mark::from_the_top(index, answer, stage, column as u32, level)
            })
            .collect();
        let stack = heights.iter().copied().max().unwrap_or(0);
        // Marks are placed from the top; flip them so that columns grow
        // upwards from the lane's baseline.
        let height = stack * Timeline::STEP;
        let marks = marks
            .into_iter()
            .map(|mark| Mark {
                y: height - mark.y,
                ..mark
            })
            .collect::<Vec<_>>();
        (!marks.is_empty()).then(|| Lane {
            label: label(stage),
            class: stage.class().to_owned(),
            count: marks.len(),
            height,
            marks,
        })
    }
}

impl Mark {
    /// Request `index`'s mark, `level` marks down from the top of its
    /// column.
    fn from_the_top(index: usize, answer: &Answer, stage: Stage, column: u32, level: u32) -> Self {
        Mark {
            x: column * Timeline::STEP + Timeline::STEP / 2,
            y: level * Timeline::STEP + Timeline::STEP / 2,
            shape: if answer.replayed {
                "diamond"
            } else if stage == Stage::Moved {
                "circle"
            } else {
                "square"
            }
            .to_owned(),
            title: format!(
                "Request {}: {} after {}",
                index + 1,
                how_it_ended(answer),
                milliseconds(answer.answered)
            ),
        }
    }
}

/// The cooldown window's right edge on an axis of `axis_ms` drawn `width`
/// wide, and the sentence saying what the shading is.
fn cooldown_shading(window: Duration, axis_ms: f64, width: u32) -> (Option<u32>, String) {
    let window_ms = window.as_secs_f64() * 1000.0;
    let edge = (window_ms / axis_ms).min(1.0) * f64::from(width);
    let note = if window_ms >= axis_ms {
        format!(
            "Shaded: the cooldown window, {} from the first request. The whole run fell inside it.",
            axis_label(window_ms)
        )
    } else {
        format!(
            "Shaded: the cooldown window, {} from the first request; it had ended when the requests to its right \
             arrived.",
            axis_label(window_ms)
        )
    };
    (Some(edge.round() as u32), note)
}

/// The column nearest `wanted` with fewer than `stack_max` marks, looking
/// left and right alternately; `wanted` itself when every column is full.
fn nearest_column_with_room(heights: &[u32], wanted: u32, stack_max: u32) -> usize {
    let wanted = wanted as usize;
    (0..heights.len())
        .flat_map(|distance| [wanted.checked_add(distance), wanted.checked_sub(distance)])
        .flatten()
        .find(|column| heights.get(*column).is_some_and(|height| *height < stack_max))
        .unwrap_or(wanted)
}

/// An axis end at or above `last_ms` whose quarters are round numbers of
/// milliseconds: 1, 2, 4, 6 or 8 times a power of ten.
fn nice_axis_ms(last_ms: f64) -> f64 {
    let last_ms = last_ms.max(1.0);
    let mut power = 1.0;
    while power * 10.0 < last_ms {
        power *= 10.0;
    }
    [1.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|end| *end >= last_ms)
        .unwrap_or(10.0 * power)
}

/// A tick's label: milliseconds, with a thousands separator.
fn axis_label(ms: f64) -> String {
    let whole = ms.round() as u64;
    if ms < 10.0 && (ms - ms.round()).abs() > f64::EPSILON {
        return format!("{ms:.1} ms");
    }
    format!("{} ms", money::group_thousands(whole))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::race_lab::presets::Preset;

    #[test]
    fn the_axis_ends_at_a_round_number_at_or_past_the_last_answer() {
        assert_eq!(nice_axis_ms(0.3), 1.0);
        assert_eq!(nice_axis_ms(37.0), 40.0);
        assert_eq!(nice_axis_ms(100.0), 100.0);
        assert_eq!(nice_axis_ms(5_300.0), 6_000.0);
        assert_eq!(axis_label(0.5), "0.5 ms");
        assert_eq!(axis_label(1_500.0), "1,500 ms");
    }

    /// 200 answers at the same moment, and 200 spread over the run: every
    /// mark has a place of its own, and no lane grows past its stack limit.
    #[test]
    fn two_hundred_marks_stay_countable() {
        use crate::decision::{Decision, Layer, Outcome};
        use crate::race_lab::burst::{Answer, Shot};
        let answer = |at_ms: u64| Answer {
            shot: Shot {
                from: uuid::Uuid::nil(),
                to: uuid::Uuid::nil(),
                amount_minor: 1,
                key: None,
            },
            sent: Duration::ZERO,
            answered: Duration::from_millis(at_ms),
            status: 429,
            decision: Some(Decision::new(Layer::Cooldown, Outcome::Rejected)),
            replayed: false,
            body: String::new(),
            trace_id: None,
        };
        for answers in [
            (0..200).map(|_| answer(3)).collect::<Vec<_>>(),
            (0..200).map(answer).collect::<Vec<_>>(),
        ] {
            let timeline = Timeline::of(&answers, &|stage| stage.label(Preset::SameKey).to_owned(), None);
            let lane = &timeline.lanes[0];
            assert_eq!(lane.count, 200);
            let mut places: Vec<(u32, u32)> = lane.marks.iter().map(|mark| (mark.x, mark.y)).collect();
            places.sort_unstable();
            places.dedup();
            assert_eq!(places.len(), 200, "two marks share a place");
            assert!(lane.height <= Timeline::STACK_MAX * Timeline::STEP);
            assert!(places.iter().all(|(x, _)| *x < timeline.width));
        }
    }

    #[test]
    fn a_full_column_spills_to_the_nearest_column_with_room() {
        let heights = [0, 0, 10, 10, 0];
        assert_eq!(nearest_column_with_room(&heights, 2, 10), 1);
        assert_eq!(nearest_column_with_room(&heights, 3, 10), 4);
        assert_eq!(nearest_column_with_room(&heights, 0, 10), 0);
        // Every column full: the mark stays where it belongs.
        assert_eq!(nearest_column_with_room(&[10, 10], 1, 10), 1);
    }
}
