//! Reading a JSON object body field by field, so that a body that breaks
//! the rules gets one 422 naming every field it got wrong, each by a JSON
//! Pointer (RFC 9457's `errors` extension, as in its own example), instead
//! of the JSON parser's first complaint. Values are never echoed back: a
//! field may be a password.

use serde::Serialize;
use serde_json::{Map, Value};

use super::Problem;

/// One field a request got wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// A JSON Pointer into the request body, as a URI fragment: `#/amount_minor`;
    /// `#` for the body as a whole.
    #[schema(example = "#/amount_minor")]
    pub pointer: String,
    /// What is wrong there, in a sentence fragment: "must be a positive integer".
    pub detail: String,
}

impl FieldError {
    /// `detail` about the body's field `field`.
    pub fn at(field: &str, detail: impl Into<String>) -> Self {
        Self {
            pointer: pointer_to(field),
            detail: detail.into(),
        }
    }
}

/// A JSON object body and the field errors found in it so far.
pub struct Fields {
    /// `None` when the body is not an object: its fields are then not
    /// asked about one by one.
    object: Option<Map<String, Value>>,
    errors: Vec<FieldError>,
}

impl Fields {
    /// Reads `body` as a JSON object with only the `known` fields. Not JSON
    /// at all is a 400; anything else wrong is collected, and reported with
    /// the rest by `finish`.
    pub fn of(body: &[u8], known: &[&str]) -> Result<Self, Problem> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|error| Problem::bad_request(format!("The body is not valid JSON: {error}.")))?;
        let mut fields = Self {
            object: None,
            errors: Vec::new(),
        };
        match value {
            Value::Object(object) => {
                for name in object.keys().filter(|name| !known.contains(&name.as_str())) {
                    fields.errors.push(FieldError::at(
                        name,
                        format!("is not a field here; the fields are {}", known.join(", ")),
                    ));
                }
                fields.object = Some(object);
            }
            _ => fields.errors.push(FieldError {
                pointer: "#".to_owned(),
                detail: format!("must be a JSON object with the fields {}", known.join(", ")),
            }),
        }
        Ok(fields)
    }

    /// No field has broken a rule so far.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }

    /// Notes that `field` breaks a rule.
    pub fn refuse(&mut self, field: &str, detail: impl Into<String>) {
        self.errors.push(FieldError::at(field, detail));
    }

    /// `field` as a string, or `None` with the error noted.
    pub fn string(&mut self, field: &str) -> Option<String> {
        match self.value(field) {
            Some(Value::String(text)) => Some(text.clone()),
            found => {
                let present = found.is_some();
                self.wrong(field, present, "must be a string");
                None
            }
        }
    }

    /// `field` as a whole number: an integer, or a number with no fraction
    /// (`57340.0` is the integer 57340, as JSON Schema reads it).
    pub fn integer(&mut self, field: &str) -> Option<i64> {
        let whole = match self.value(field) {
            Some(Value::Number(number)) => number.as_i64().or_else(|| {
                number
                    .as_f64()
                    .filter(|float| float.fract() == 0.0 && float.abs() < 2f64.powi(63))
                    .map(|float| float as i64)
            }),
            _ => None,
        };
        if whole.is_none() {
            let present = self.value(field).is_some();
            self.wrong(field, present, "must be a whole number");
        }
        whole
    }

    fn value(&self, field: &str) -> Option<&Value> {
        self.object.as_ref().and_then(|object| object.get(field))
    }

    fn wrong(&mut self, field: &str, present: bool, rule: &str) {
        if self.object.is_none() {
            return;
        }
        let detail = if present { rule } else { "is required" };
        self.refuse(field, detail);
    }

    /// The 422 naming every field error found, if there is any; `what`
    /// introduces the detail ("The transfer body is not valid").
    pub fn finish(self, what: &str) -> Result<(), Problem> {
        if self.errors.is_empty() {
            return Ok(());
        }
        let listed = self
            .errors
            .iter()
            .map(|error| {
                let field = error
                    .pointer
                    .trim_start_matches("#/")
                    .replace("~1", "/")
                    .replace("~0", "~");
                if field == "#" {
                    format!("the body {}", error.detail)
                } else {
                    format!("{field} {}", error.detail)
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(Problem::validation(format!("{what}: {listed}.")).with_errors(self.errors))
    }
}

/// `#/name`, with `~` and `/` escaped as RFC 6901 says.
fn pointer_to(field: &str) -> String {
    format!("#/{}", field.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointers(problem: &Problem) -> Vec<&str> {
        problem
            .errors
            .iter()
            .flat_map(|errors| errors.iter())
            .map(|error| error.pointer.as_str())
            .collect()
    }

    #[test]
    fn every_wrong_field_is_named_by_its_pointer() {
        let mut fields = Fields::of(br#"{"a": 1, "b": "x", "c/d": 2}"#, &["a", "b", "e"]).expect("json");
        assert_eq!(fields.string("a"), None);
        assert_eq!(fields.integer("b"), None);
        assert_eq!(fields.integer("e"), None);
        let problem = fields.finish("The body is not valid").expect_err("errors");
        assert_eq!(problem.status, 422);
        assert_eq!(pointers(&problem), ["#/c~1d", "#/a", "#/b", "#/e"]);
        assert_eq!(
            problem.detail,
            "The body is not valid: c/d is not a field here; the fields are a, b, e; a must be a string; \
             b must be a whole number; e is required."
        );
    }

    #[test]
    fn a_whole_float_is_an_integer_and_a_fraction_is_not() {
        let mut fields = Fields::of(br#"{"n": 57340.0, "m": 1.5}"#, &["n", "m"]).expect("json");
        assert_eq!(fields.integer("n"), Some(57_340));
        assert_eq!(fields.integer("m"), None);
        assert_eq!(pointers(&fields.finish("x").expect_err("m")), ["#/m"]);
    }

    #[test]
    fn not_json_is_a_400_and_not_an_object_is_a_422_on_the_whole_body() {
        assert_eq!(Fields::of(b"{", &["a"]).err().map(|p| p.status), Some(400));
        let problem = Fields::of(b"[1]", &["a"])
            .expect("json")
            .finish("x")
            .expect_err("array");
        assert_eq!(pointers(&problem), ["#"]);
        assert_eq!(
            problem.detail,
            "x: the body must be a JSON object with the fields a."
        );
    }
}
