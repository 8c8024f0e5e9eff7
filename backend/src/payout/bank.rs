//! Where a payout is sent: the deployment's bank gateway, or, for a
//! race-lab run, the lab's own bank. Both answer in the gateway's terms,
//! so the saga records either the same way.

use super::gateway::{GatewayAnswer, GatewayClient, GatewayPayout};
use super::lab_bank::LabBank;

#[derive(Clone, Copy)]
pub enum Bank<'a> {
    Gateway(&'a GatewayClient),
    Lab(&'a LabBank),
}

impl Bank<'_> {
    pub async fn send(
        &self,
        key: &str,
        payout: &GatewayPayout<'_>,
        traceparent: Option<&str>,
    ) -> GatewayAnswer {
        match self {
            Bank::Gateway(gateway) => gateway.send(key, payout, traceparent).await,
            Bank::Lab(lab) => lab.send(key, payout).await,
        }
    }

    /// A lab bank's calls are the race lab's, kept out of the deployment's
    /// payout metrics.
    pub fn is_lab(&self) -> bool {
        matches!(self, Bank::Lab(_))
    }
}
