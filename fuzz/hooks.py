"""Checks of scripts/fuzz beyond schemathesis's own."""

import schemathesis


@schemathesis.check
def foreign_resources_stay_hidden(ctx, response, case):
    """Another user's wallet or transfer is never served: 404 (or a refusal
    of the request itself), never a 2xx."""
    if 200 <= response.status_code < 300:
        raise AssertionError(
            f"{case.method} {case.formatted_path} served another user's resource ({response.status_code})"
        )
