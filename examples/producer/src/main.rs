//! `kpng-example-producer`: a producer of `kpng aggregate` written from
//! `aggregatorv1.proto` alone, as another vendor's agent would be.
//!
//! ```text
//! kpng-example-producer --aggregator unix:///run/kpng/aggregator.sock \
//!     --producer allowlist --table allowlist --allow 10.0.0.0/8 --allow 192.168.1.5
//! ```
//!
//! It publishes one table, `inet <table>`, holding the set `allowed` of the `--allow`
//! addresses and an input chain that counts and accepts their traffic, as its whole state
//! (revision 1), waits for the aggregator's answer, prints it, and exits: 0 once the
//! aggregator has committed the revision, 1 if it refused it, 2 on bad arguments or a
//! connection that fails. The aggregator keeps the table for its producer lease after the
//! producer leaves. Addresses: `unix:///path` (the aggregator admits root and the users it
//! allows) or `tcp://host:port`, which this example speaks in plaintext only, so it must be
//! asked for with `--insecure` (and the aggregator started with `--insecure` too); a real
//! agent would use mutual TLS.

mod aggregatorv1 {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("aggregatorv1");
}

use aggregatorv1::aggregator_client::AggregatorClient;
use aggregatorv1::{Ack, Chain, Publication, Set, State, Table, TableRef, Update, ack, update};
use tonic::transport::{Channel, Endpoint, Uri};

/// What the command line asks for.
struct Args {
    aggregator: String,
    insecure: bool,
    producer: String,
    table: String,
    allow: Vec<String>,
}

const USAGE: &str = "usage: kpng-example-producer --aggregator ADDR [--insecure] \
                     --producer NAME --table NAME --allow ADDR [--allow ADDR ...]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut aggregator, mut producer, mut table, mut allow) = (None, None, None, Vec::new());
    let mut insecure = false;
    while let Some(flag) = args.next() {
        if flag == "--insecure" {
            insecure = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--aggregator" => aggregator = Some(value),
            "--producer" => producer = Some(value),
            "--table" => table = Some(value),
            "--allow" => allow.push(value),
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    let missing = |what| format!("{what} is required\n{USAGE}");
    let args = Args {
        aggregator: aggregator.ok_or_else(|| missing("--aggregator"))?,
        insecure,
        producer: producer.ok_or_else(|| missing("--producer"))?,
        table: table.ok_or_else(|| missing("--table"))?,
        allow,
    };
    if args.allow.is_empty() {
        return Err(missing("--allow"));
    }
    if args.aggregator.starts_with("tcp://") && !args.insecure {
        return Err(format!(
            "{}: this example speaks plaintext TCP, which authenticates nobody: use a unix:// \
             socket, or accept plaintext with --insecure",
            args.aggregator
        ));
    }
    Ok(args)
}

/// The producer's whole state: one table with its allow-list.
fn whole_state(args: &Args) -> Publication {
    let table = Table {
        table: Some(TableRef { family: "inet".into(), name: args.table.clone() }),
        chains: vec![Chain {
            name: "input".into(),
            declaration: "type filter hook input priority 0; policy accept;".into(),
            rules: vec!["ip saddr @allowed counter accept".into()],
        }],
        sets: vec![Set {
            name: "allowed".into(),
            map: false,
            declaration: "type ipv4_addr; flags interval;".into(),
            elements: args.allow.clone(),
        }],
    };
    let whole = Update { op: Some(update::Op::Whole(State { tables: vec![table] })) };
    Publication { producer: args.producer.clone(), revision: 1, updates: vec![whole] }
}

/// A channel to the aggregator.
async fn connect(address: &str) -> Result<Channel, String> {
    let failed = |e: tonic::transport::Error| format!("connecting to {address}: {e}");
    if let Some(path) = address.strip_prefix("unix://") {
        let path = path.to_string();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        // The connector ignores the URI; it only has to be valid.
        return Endpoint::from_static("http://aggregator.local")
            .connect_with_connector(connector)
            .await
            .map_err(failed);
    }
    let Some(authority) = address.strip_prefix("tcp://") else {
        return Err(format!("{address}: expected unix:///path or tcp://host:port"));
    };
    let endpoint = Endpoint::from_shared(format!("http://{authority}")).map_err(failed)?;
    endpoint.connect().await.map_err(failed)
}

/// Publishes the whole state and returns the aggregator's first answer.
async fn publish(args: &Args) -> Result<Ack, String> {
    let mut client = AggregatorClient::new(connect(&args.aggregator).await?);
    if args.insecure {
        eprintln!("warning: --insecure: plaintext TCP to {}", args.aggregator);
    }
    // The stream stays open until the answer came: closing it would start the lease.
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    sender.send(whole_state(args)).await.map_err(|_| "the stream closed".to_string())?;
    let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
    let response = client.publish(stream).await.map_err(|s| format!("publishing: {s}"))?;
    let mut acks = response.into_inner();
    let ack = acks.message().await.map_err(|s| format!("waiting for the answer: {s}"))?;
    drop(sender);
    ack.ok_or_else(|| "the aggregator closed the stream without answering".to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(2);
        }
    };
    match publish(&args).await.map(|ack| ack.result) {
        Ok(Some(ack::Result::Committed(revision))) => {
            println!("committed revision {revision}");
            std::process::ExitCode::SUCCESS
        }
        Ok(Some(ack::Result::Rejected(r))) => {
            eprintln!("revision {} refused: {}: {}", r.revision, r.object, r.message);
            std::process::ExitCode::from(1)
        }
        Ok(None) => {
            eprintln!("the aggregator answered with an empty acknowledgement");
            std::process::ExitCode::from(2)
        }
        Err(message) => {
            eprintln!("{message}");
            std::process::ExitCode::from(2)
        }
    }
}
