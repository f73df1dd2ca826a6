//! `warmroute-sim`: parses the flags and serves (see the library docs for what is simulated).

use clap::Parser;
use warmroute_sim::{bind, serve_with_shutdown, Args};

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(e) = args.validate() {
        eprintln!("warmroute-sim: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let listener = match bind(&args).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "warmroute-sim: cannot bind {}:{}: {e}",
                args.host, args.port
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("warmroute-sim: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // One machine-readable line so scripts can wait for readiness and learn the port.
    println!(
        "warmroute-sim listening on http://{addr} name={} model={} time_scale={}",
        args.replica_name(addr.port()),
        args.served_model_names().join(","),
        args.time_scale
    );
    match serve_with_shutdown(args, listener, shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warmroute-sim: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
