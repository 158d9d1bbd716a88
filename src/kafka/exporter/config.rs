//! [`ExportConfig`]: what an export produces to, as whom, and how it waits.

use std::time::Duration;

use crate::cursor_store::check_consumer;
use crate::error::{Error, Result};

/// What to export to and as whom.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ExportConfig {
    /// The topic every event goes to.
    pub topic: String,
    /// The consumer name the cursors are saved under (`changefeed.consumer_cursor`).
    pub consumer: String,
    /// Rows per `read_feed` page.
    pub page_size: u32,
    /// The first wait before a page is produced again after a retriable failure; it
    /// doubles with each consecutive failure. Default 100 ms.
    pub backoff_min: Duration,
    /// The longest wait between two attempts at a page. Default 10 s.
    pub backoff_max: Duration,
    /// After shutdown, how long the page in flight may still take to be acknowledged
    /// before it is given up unsaved (produced again by the next run). Default 30 s.
    pub shutdown_grace: Duration,
}

impl ExportConfig {
    /// Exports to `topic` as `consumer`.
    pub fn new(topic: impl Into<String>, consumer: impl Into<String>) -> Self {
        ExportConfig {
            topic: topic.into(),
            consumer: consumer.into(),
            page_size: 1000,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    setters! {
        /// Sets `page_size`.
        page_size: u32;
        /// Sets `backoff_min`, the first wait after a retriable failure (at least 1 ms).
        backoff_min: Duration;
        /// Sets `backoff_max`, the longest wait between attempts (at least `backoff_min`).
        backoff_max: Duration;
        /// Sets `shutdown_grace`, how long the page in flight may take after shutdown.
        shutdown_grace: Duration;
    }

    /// Checks the settings; the error names the setting and what it must be.
    pub(super) fn validate(&self) -> Result<()> {
        if self.topic.is_empty() {
            return Err(Error::Config(
                "the export topic is empty; name the Kafka topic to produce to".to_owned(),
            ));
        }
        check_consumer(&self.consumer)?;
        if self.backoff_min < Duration::from_millis(1) || self.backoff_max < self.backoff_min {
            return Err(Error::Config(format!(
                "export back-off is {:?} to {:?}; backoff_min must be at least 1 ms and \
                 backoff_max at least backoff_min",
                self.backoff_min, self.backoff_max
            )));
        }
        Ok(())
    }
}
