"""The main fuzz run's hold on the document (scripts/fuzz): a schema-valid
request is refused only by a rule no schema can state, and a schema-invalid
one is accepted only where the document says the server reads more than
its schema states.

Positive data acceptance takes 422 as an answer (fuzz/schemathesis.toml),
because a valid request may still break a business rule. The check below
then asks which rule: it must be one of those listed here, with its own
problem type. `validation-failed` means the document left out a bound the
server enforces, and fails the run, with one exception, the one rule of
that type a schema cannot state: a transfer's two wallets must differ.
"""

import json
import os
import re

import jsonschema_rs
import schemathesis
from schemathesis.core.failures import AcceptedNegativeData

# The problem types of rules that depend on stored data or on another
# field, which no JSON Schema can state.
BUSINESS_RULES = {
    "insufficient-funds",  # the balance does not cover the amount
    "unknown-target-wallet",  # no such wallet to send to
    "currency-mismatch",  # the two wallets hold different currencies
    "same-wallet",  # a transfer names one wallet twice
    "idempotency-key-reused",  # the key named another request before
    "lab-wallets-only",  # race-lab switches on a transfer between real wallets
    "event-payload-changed",  # a deposit event's id came with other contents before
    "deposit-wallet-unknown",
    "deposit-currency-mismatch",
    "deposit-amount-over-limit",
    "deposit-event-too-old",
    "deposit-event-in-future",
}


def _headers_keep_their_schemas(case):
    """Whether every declared header the case sends is valid: a positive
    case may still send one empty (schemathesis treats an empty header as
    a missing one), which is not schema-valid data."""
    document = _document()
    operation = document["paths"].get(case.operation.path, {}).get(case.method.lower(), {})
    sent = {name.lower(): value for name, value in (case.headers or {}).items()}
    for parameter in operation.get("parameters", []):
        value = sent.get(parameter["name"].lower())
        if parameter["in"] != "header" or value is None:
            continue
        schema = {**parameter["schema"], "components": document["components"]}
        if not jsonschema_rs.validator_for(schema).is_valid(value):
            return False
    return True


@schemathesis.check
def refused_only_by_business_rules(ctx, response, case):
    """A schema-valid request answered 422 broke a rule no schema states."""
    if case.meta is None or not case.meta.generation.mode.is_positive or response.status_code != 422:
        return None
    if not _headers_keep_their_schemas(case):
        return None
    try:
        problem = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{case.method} {case.formatted_path}: a 422 without a problem body")
    kind = str(problem.get("type", "")).removeprefix("/problems/")
    if kind in BUSINESS_RULES:
        return None
    raise AssertionError(
        f"{case.method} {case.formatted_path}: a schema-valid request was refused as {kind!r} "
        f"({problem.get('detail')}); the document must state the bound it broke"
    )


def _document():
    with open(os.environ["FUZZ_OPENAPI_DOCUMENT"]) as file:
        return json.load(file)


def _widened(document, schema):
    """`schema` with every `x-accepted-pattern` in place of its `pattern`."""
    if isinstance(schema, dict):
        if "x-accepted-pattern" in schema:
            schema = {**schema, "pattern": schema["x-accepted-pattern"]}
        return {key: _widened(document, value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_widened(document, value) for value in schema]
    return schema


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    """Every failure counts but a schema-invalid body accepted where the
    document says the server reads more than the schema states: the body
    breaks only a narrower `pattern` and keeps its `x-accepted-pattern`
    (a name in another script than Latin, for one)."""
    if not isinstance(failure, AcceptedNegativeData) or not isinstance(case.body, dict):
        return True
    document = _document()
    operation = document["paths"].get(case.operation.path, {}).get(case.method.lower(), {})
    reference = (
        operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
    )
    if reference is None:
        return True
    components = _widened(document, document["components"])
    if json.dumps(components) == json.dumps(document["components"]):
        return True
    wider = {"$ref": reference, "components": components}
    try:
        accepted = jsonschema_rs.validator_for(wider).is_valid(case.body)
    except (ValueError, re.error):
        return True
    # Keep the failure unless the wider form admits the body.
    return not accepted
