//! A custom `Publisher`: how a real broker client plugs into the relay, and how it tells the
//! relay what each failure means.
//!
//! This one "publishes" into an in-memory topic map and simulates a broker's answers:
//! a payload with `"poison": true` can never be published (dead + dead-letter), a topic
//! named `slow` pushes back (requeued without counting an attempt), and everything else
//! succeeds. A dead-letter hand-off writes to a `dead-letters` topic with the headers the
//! relay adds (original topic, attempts, error).
//!
//! ```sh
//! CHANGEFEED_URL='...' cargo run --example custom_publisher
//! ```

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use changefeed::outbox::{ClaimedMessage, Headers, NewMessage};
use changefeed::outbox_store::SqlClaimStore;
use changefeed::relay::{DeadLetter, PublishError, PublishOutcome, Publisher, Relay, RelayConfig};

#[derive(Default)]
struct InMemoryBroker {
    topics: Mutex<BTreeMap<String, Vec<serde_json::Value>>>,
}

impl Publisher for InMemoryBroker {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let mut topics = self.topics.lock().expect("not poisoned");
        batch
            .iter()
            .map(|message| {
                if message.payload.get("poison") == Some(&serde_json::Value::Bool(true)) {
                    return Err(PublishError::poison("the broker rejects this payload"));
                }
                if message.topic == "slow" {
                    return Err(PublishError::backpressure("topic 'slow' is throttled"));
                }
                topics
                    .entry(message.topic.clone())
                    .or_default()
                    .push(message.payload.clone());
                Ok(())
            })
            .collect()
    }

    /// Dead letters keep the payload as text: a row the relay could not decode has only
    /// its raw text.
    async fn publish_dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &Headers,
    ) -> Result<(), PublishError> {
        let mut topics = self.topics.lock().expect("not poisoned");
        topics.entry("dead-letters".to_owned()).or_default().push(
            serde_json::json!({ "id": letter.id(), "payload": letter.payload_text(), "headers": headers }),
        );
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let messages = [
        NewMessage::new("orders", serde_json::json!({ "order": 1 })),
        NewMessage::new("orders", serde_json::json!({ "order": 2, "poison": true })),
        NewMessage::new("slow", serde_json::json!({ "order": 3 })),
    ];
    let (outbox, pool) = support::outbox_with("dbo.custom_publisher_outbox", &messages).await;

    let broker = std::sync::Arc::new(InMemoryBroker::default());
    let relay = Relay::new(
        SqlClaimStore::with_pool(outbox, pool),
        std::sync::Arc::clone(&broker),
        RelayConfig::default(),
    )
    .unwrap_or_else(|e| support::exit_with(e));
    // Run for a few seconds, then drain and show what the broker received.
    let shutdown = tokio::time::sleep(Duration::from_secs(5));
    if let Err(error) = relay.run(shutdown).await {
        support::exit_with(error);
    }
    let topics = broker.topics.lock().expect("not poisoned");
    println!("{}", serde_json::to_string_pretty(&*topics).expect("JSON"));
}
