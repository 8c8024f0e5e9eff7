//! The client's types against the OpenAPI document the server serves: each
//! type has exactly the schema's properties, and every property the schema
//! requires. A field renamed or added on either side fails here.

use std::collections::BTreeSet;

use serde_json::Value;
use uuid::Uuid;
use wallet_client::{SignedIn, SignedUp, TransferItem, TransferOrder, TransferPage, TransferReceipt, Wallet};
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
            "TransferPage",
            keys(&TransferPage {
                items: vec![item.clone()],
                next_before: Some(Uuid::nil()),
            }),
        ),
    ];
    for (name, client_fields) in samples {
        let schema = &document["components"]["schemas"][name];
        let properties: BTreeSet<String> = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("the document has no schema {name}"))
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            client_fields, properties,
            "{name}: the client and the server disagree"
        );
        let required: BTreeSet<String> = schema["required"]
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        assert!(required.is_subset(&client_fields), "{name}: {required:?}");
    }
}
