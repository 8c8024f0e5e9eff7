//! Every problem type is named once, and said to people in their words.

use super::*;
use crate::problem::Problem;

#[test]
fn every_problem_type_has_a_distinct_slug_and_a_sentence_for_people() {
    let mut slugs = std::collections::HashSet::new();
    for kind in ProblemType::ALL {
        assert!(slugs.insert(kind.slug()), "{kind:?}");
        assert_eq!(ProblemType::from_slug(kind.slug()), Some(kind));
        let sentence = kind.for_people();
        assert!(sentence.ends_with('.'), "{kind:?}: {sentence}");
        for api_word in [
            "_id",
            "amount_minor",
            "Idempotency-Key",
            "Bearer",
            "JSON",
            "/api/",
        ] {
            assert!(
                !sentence.contains(api_word),
                "{kind:?} speaks API to people: {sentence}"
            );
        }
    }
}

#[test]
fn a_body_names_its_type() {
    let body = Problem::new(ProblemType::InsufficientFunds, "x").body();
    assert_eq!(ProblemType::of_body(&body), Some(ProblemType::InsufficientFunds));
    assert_eq!(ProblemType::of_body("{}"), None);
}
