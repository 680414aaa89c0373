//! The skyport binary: flags in, controllers running.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use skyport::config::{Cli, Command, RunArgs};
use skyport::{controllers, crd, telemetry};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // kube and the AWS client both use rustls; pin one process-wide crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            print!("{}", crd::to_yaml(&crd::all())?);
            Ok(())
        }
        Command::Run(args) => run(args).await,
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    telemetry::init(args.log_format);
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes configuration found (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let sqs = providers::SqsProvider::from_env(&args.aws.sqs_settings()).await;
    info!(
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        region = sqs.region().as_deref().unwrap_or("<unset>"),
        resync = ?args.queue.resync,
        "starting skyport"
    );
    let (_ctx, queues) = controllers::queue::controller(
        client,
        Arc::new(sqs),
        args.queue.clone(),
        args.namespace.clone(),
        shutdown_signal(),
    );
    queues.await;
    info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    info!("shutdown requested; finishing reconciles in flight");
}
