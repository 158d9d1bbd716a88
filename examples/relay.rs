//! A claim-outbox relay that publishes to stdout as JSON lines.
//!
//! ```sh
//! CHANGEFEED_URL='server=tcp:localhost,1433;user=sa;password=...;database=app;TrustServerCertificate=true' \
//!   cargo run --example relay
//! ```
//!
//! It applies the changefeed migrations, creates the claim outbox `dbo.outbox` if needed,
//! enqueues three demo messages (two of one aggregate, so they come out in order), and relays
//! until Ctrl-C, then finishes the batch in flight and stops.

#[path = "support/mod.rs"]
mod support;

use changefeed::outbox::NewMessage;
use changefeed::outbox_store::SqlClaimStore;
use changefeed::relay::{JsonLines, Relay, RelayConfig};

#[tokio::main]
async fn main() {
    let messages: Vec<NewMessage> = [(1, "order-1"), (2, "order-1"), (3, "order-2")]
        .into_iter()
        .map(|(n, aggregate)| {
            NewMessage::new("orders", serde_json::json!({ "demo": n }))
                .aggregate("order", aggregate)
        })
        .collect();
    let (outbox, pool) = support::outbox_with("dbo.outbox", &messages).await;

    let store = SqlClaimStore::with_pool(outbox, pool);
    let relay = Relay::new(store, JsonLines, RelayConfig::default())
        .unwrap_or_else(|e| support::exit_with(e));
    eprintln!("relaying dbo.outbox to stdout; Ctrl-C stops");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(error) = relay.run(shutdown).await {
        support::exit_with(error);
    }
}
