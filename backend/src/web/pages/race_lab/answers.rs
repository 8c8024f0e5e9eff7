//! The answers of a run grouped by stage and how they ended, each group
//! with a few examples, and how one answer is told in words.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::problem::ProblemType;
use crate::race_lab::burst::Answer;
use crate::race_lab::presets::Stage;
use crate::state::AppState;

/// Examples shown under each group of answers.
const EXAMPLES_PER_GROUP_MAX: usize = 5;

#[derive(Serialize, Deserialize)]
pub(super) struct Group {
    pub(super) label: String,
    pub(super) class: String,
    pub(super) how: String,
    pub(super) count: usize,
    pub(super) examples: Vec<Example>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Example {
    pub(super) number: usize,
    pub(super) status: String,
    pub(super) problem: String,
    /// A refusal's problem body as it was sent, for engineers; empty for a
    /// success.
    pub(super) body: String,
    /// `/problems/{slug}` of a refusal.
    pub(super) problem_link: Option<String>,
    pub(super) key: String,
    pub(super) latency: String,
    /// The instance that answered: the burst goes to the one serving the page.
    pub(super) instance: String,
    pub(super) trace_link: Option<String>,
    pub(super) trace_id: String,
}

/// The answers grouped by stage and how they ended, each group with a few
/// examples.
pub(super) fn groups(state: &AppState, label: &dyn Fn(Stage) -> String, answers: &[Answer]) -> Vec<Group> {
    let mut grouped: BTreeMap<(Stage, String), Vec<(usize, &Answer)>> = BTreeMap::new();
    for (index, answer) in answers.iter().enumerate() {
        grouped
            .entry((Stage::of(answer), how_it_ended(answer)))
            .or_default()
            .push((index, answer));
    }
    grouped
        .into_iter()
        .map(|((stage, how), members)| Group {
            label: label(stage),
            class: stage.class().to_owned(),
            how,
            count: members.len(),
            examples: members
                .iter()
                .take(EXAMPLES_PER_GROUP_MAX)
                .map(|(index, answer)| Example::of(state, *index, answer))
                .collect(),
        })
        .collect()
}

impl Example {
    /// Request `index`'s answer, with links to its problem type and its
    /// trace.
    fn of(state: &AppState, index: usize, answer: &Answer) -> Self {
        let trace_ui = &state.config.demo.trace_ui_url;
        let trace_id = answer.trace_id.clone().unwrap_or_default();
        Example {
            number: index + 1,
            status: if answer.status == 0 {
                "no answer".to_owned()
            } else {
                answer.status.to_string()
            },
            problem: problem_sentence(answer),
            body: if answer.status >= 400 {
                answer.body.clone()
            } else {
                String::new()
            },
            problem_link: ProblemType::of_body(&answer.body).map(|kind| format!("/problems/{}", kind.slug())),
            key: answer
                .shot
                .key
                .map(crate::domain::short_id)
                .unwrap_or_else(|| "none".to_owned()),
            latency: milliseconds(answer.latency()),
            instance: state.instance_id.to_string(),
            trace_link: (!trace_ui.is_empty() && !trace_id.is_empty())
                .then(|| trace_ui.replace("{trace_id}", &trace_id)),
            trace_id,
        }
    }
}

/// A refusal's own sentence, from its problem body; empty for a success.
fn problem_sentence(answer: &Answer) -> String {
    serde_json::from_str::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|body| body.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
        .filter(|_| answer.status >= 400)
        .unwrap_or_default()
}

/// How one answer ended, as a sentence fragment for people.
pub(super) fn how_it_ended(answer: &Answer) -> String {
    if answer.status == 0 {
        return "no answer".to_owned();
    }
    if answer.replayed {
        return format!("replayed the stored answer ({})", answer.status);
    }
    match ProblemType::of_body(&answer.body) {
        Some(kind) => format!("{} ({})", kind.title().to_lowercase(), answer.status),
        // The stage's own label says what a success did; its answer is
        // told by its status alone, so that the two never repeat.
        None if answer.status == 201 => "answered 201 Created".to_owned(),
        None if answer.status == 200 => "answered 200 OK".to_owned(),
        None if answer.status == 202 => "answered 202 Accepted".to_owned(),
        None => format!("answered {}", answer.status),
    }
}

/// A time, in milliseconds to a tenth.
pub(super) fn milliseconds(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}
