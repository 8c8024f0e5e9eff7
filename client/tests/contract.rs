//! The client's types against the OpenAPI document the server serves: each
//! type has exactly the schema's properties, and every property the schema
//! requires. A field renamed or added on either side fails here.

use std::collections::BTreeSet;

use serde_json::Value;
use uuid::Uuid;
use wallet_client::{
    Decision, DecisionPage, Payout, PayoutOrder, PayoutReceipt, SignedIn, SignedUp, TransferItem,
    TransferOrder, TransferPage, TransferReceipt, Wallet,
};
use wallet_testkit::*;

fn keys(value: &impl serde::Serialize) -> BTreeSet<String> {
    serde_json::to_value(value)
        .expect("json")
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

/// A schema's properties and required names, through `$ref` and `allOf`
/// (a flattened struct is served as `allOf`).
fn fields_of(document: &Value, schema: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap_or_default();
        return fields_of(document, &document["components"]["schemas"][name]);
    }
    let mut properties: BTreeSet<String> = schema["properties"]
        .as_object()
        .map(|properties| properties.keys().cloned().collect())
        .unwrap_or_default();
    let mut required: BTreeSet<String> = schema["required"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        let (more, more_required) = fields_of(document, part);
        properties.extend(more);
        required.extend(more_required);
    }
    (properties, required)
}

#[tokio::test]
async fn the_client_types_match_the_served_document() {
    let app = spawn_app(|_| {}).await;
    let document: Value = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let now = chrono::Utc::now();
    let item = TransferItem {
        id: Uuid::nil(),
        from_wallet_id: Uuid::nil(),
        to_wallet_id: Uuid::nil(),
        amount_minor: 1,
        created_at: now,
        direction: "sent".into(),
    };
    let decision = Decision {
        id: "1-0".into(),
        time: now,
        instance_id: String::new(),
        request_id: String::new(),
        trace_id: String::new(),
        idempotency_key: Some(Uuid::nil()),
        layer: "row_guard".into(),
        outcome: "accepted".into(),
        status: 201,
        latency_ms: 1.0,
        amount_minor: Some(1),
        to_wallet_id: Some(Uuid::nil()),
        problem_type: Some("insufficient-funds".into()),
        lab: false,
        entry_point: "deposit".into(),
    };
    // Every optional field is filled, so that every property shows.
    let samples: Vec<(&str, BTreeSet<String>)> = vec![
        (
            "SignedUp",
            keys(&SignedUp {
                user_id: Uuid::nil(),
                wallet_id: Uuid::nil(),
                token: String::new(),
                balance_minor: 0,
            }),
        ),
        (
            "IssuedTokenBody",
            keys(&SignedIn {
                token: String::new(),
                expires_at: now,
            }),
        ),
        (
            "Wallet",
            keys(&Wallet {
                id: Uuid::nil(),
                balance_minor: 0,
                held_minor: 0,
                posted_balance_minor: 0,
                currency: "USD".into(),
            }),
        ),
        (
            "TransferBody",
            keys(&TransferOrder {
                from_wallet_id: Uuid::nil(),
                to_wallet_id: Uuid::nil(),
                amount_minor: 1,
            }),
        ),
        (
            "TransferReceipt",
            keys(&TransferReceipt {
                id: Uuid::nil(),
                from_wallet_id: Uuid::nil(),
                to_wallet_id: Uuid::nil(),
                amount_minor: 1,
                created_at: now,
                balance_minor_after: 0,
            }),
        ),
        ("TransferItem", keys(&item)),
        (
            "PayoutBody",
            keys(&PayoutOrder {
                from_wallet_id: Uuid::nil(),
                amount_minor: 1,
                destination: "acct-1".into(),
            }),
        ),
        (
            "PayoutReceipt",
            keys(&PayoutReceipt {
                id: Uuid::nil(),
                from_wallet_id: Uuid::nil(),
                amount_minor: 1,
                currency: "USD".into(),
                destination: "acct-1".into(),
                state: "pending".into(),
                created_at: now,
                available_balance_minor_after: 0,
            }),
        ),
        (
            "Payout",
            keys(&Payout {
                id: Uuid::nil(),
                from_wallet_id: Uuid::nil(),
                amount_minor: 1,
                currency: "USD".into(),
                destination: "acct-1".into(),
                state: "settled".into(),
                attempts: 1,
                reason: Some(String::new()),
                gateway_reference: Some(String::new()),
                created_at: now,
                updated_at: now,
            }),
        ),
        (
            "TransferPage",
            keys(&TransferPage {
                items: vec![item.clone()],
                next_before: Some(Uuid::nil()),
            }),
        ),
        ("StoredEntry", keys(&decision)),
        (
            "FeedPage",
            keys(&DecisionPage {
                items: vec![decision.clone()],
                last_id: Some("1-0".into()),
            }),
        ),
    ];
    for (name, client_fields) in samples {
        let schema = &document["components"]["schemas"][name];
        assert!(schema.is_object(), "the document has no schema {name}");
        let (properties, required) = fields_of(&document, schema);
        assert_eq!(
            client_fields, properties,
            "{name}: the client and the server disagree"
        );
        assert!(required.is_subset(&client_fields), "{name}: {required:?}");
    }
}
