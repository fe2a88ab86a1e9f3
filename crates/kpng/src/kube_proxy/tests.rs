use super::*;

const KUBEADM: &str = include_str!("kubeadm-config.conf");

fn os(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

/// The config file, written to a temporary directory, and kubeadm's command line for it.
fn kubeadm(config: &str) -> (tempfile::TempDir, Vec<OsString>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, config).unwrap();
    let args = os(&[
        "/usr/local/bin/kube-proxy",
        &format!("--config={}", path.display()),
        "--hostname-override=Node-A ",
    ]);
    (dir, args)
}

fn run(args: Vec<OsString>) -> (Vec<String>, Vec<Notice>) {
    match entry(args).unwrap() {
        Entry::Run { args, notices } => {
            (args.iter().map(|a| a.to_string_lossy().into_owned()).collect(), notices)
        }
        other => panic!("expected a run, got {other:?}"),
    }
}

/// The value following `flag` in `args`.
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

#[test]
fn kubeadms_daemon_set_runs_to_iptables_with_kube_proxys_defaults() {
    let (dir, args) = kubeadm(KUBEADM);
    let (args, notices) = run(args);
    assert_eq!(&args[1..4], ["kube", "--kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf"]);
    assert_eq!(value(&args, "to-local"), Some("to-iptables"));
    assert_eq!(value(&args, "to-iptables"), Some("--localhost-nodeports"), "kube-proxy's default");
    assert_eq!(value(&args, "--kube-api-qps"), Some("5"));
    assert_eq!(value(&args, "--kube-api-burst"), Some("10"));
    assert_eq!(value(&args, "--node"), Some("node-a"), "trimmed and lower-cased");
    assert_eq!(value(&args, "--healthz-bind-address"), Some("0.0.0.0:10256"));
    assert_eq!(value(&args, "--metrics-bind-address"), Some("127.0.0.1:10249"));
    assert_eq!(value(&args, "--nodeport-addresses"), Some("0.0.0.0/0,::/0"));
    assert_eq!(value(&args, "--conntrack-max-per-core"), Some("32768"));
    assert_eq!(value(&args, "--conntrack-tcp-timeout-established"), Some("86400000ms"));
    assert_eq!(value(&args, "--sync-period"), Some("30000ms"));
    assert_eq!(value(&args, "--min-sync-period"), None, "0s keeps kpng's meaning");
    assert_eq!(value(&args, "--oom-score-adj"), Some("-999"));
    let config = dir.path().join("config.conf");
    assert_eq!(value(&args, "--exit-on-change"), config.to_str());
    let said: Vec<String> = notices.iter().map(|n| format!("{n:?}")).collect();
    let said = said.join("\n");
    assert!(said.contains("kube-proxy's default on Linux is iptables"), "{said}");
    assert!(said.contains("minSyncPeriod 0s"), "{said}");
    assert!(!said.contains("winkernel"), "kubeadm's empty sections say nothing: {said}");
}

#[test]
fn nftables_mode_takes_its_own_section_and_primary_node_ports() {
    let text = KUBEADM.replace("mode: \"\"", "mode: nftables").replace(
        "nftables:\n  masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s",
        "nftables:\n  masqueradeAll: true\n  masqueradeBit: 7\n  minSyncPeriod: 250ms",
    );
    let (_dir, args) = kubeadm(&text);
    let (args, _) = run(args);
    assert_eq!(value(&args, "to-local"), Some("to-nft"));
    assert!(args.contains(&"--masquerade-all".to_string()));
    assert_eq!(value(&args, "--masquerade-bit"), Some("7"));
    assert_eq!(value(&args, "--min-sync-period"), Some("250ms"));
    assert_eq!(value(&args, "--nodeport-addresses"), Some("primary"));
}

#[test]
fn ipvs_and_windows_modes_are_refused_by_name() {
    for (mode, word) in [("ipvs", "IPVS"), ("kernelspace", "Windows"), ("userspace", "userspace")] {
        let (_dir, args) = kubeadm(&KUBEADM.replace("mode: \"\"", &format!("mode: {mode}")));
        let error = entry(args).unwrap_err();
        assert!(error.contains(word) && error.contains(mode), "{error}");
    }
}

#[test]
fn with_config_only_upstreams_flags_still_apply() {
    let (_dir, mut args) = kubeadm(KUBEADM);
    args.extend(os(&[
        "--masquerade-all",
        "--master=https://10.0.0.1:6443",
        "--v=4",
        "--log_dir=/x",
    ]));
    let (args, notices) = run(args);
    assert!(!args.contains(&"--masquerade-all".to_string()), "the file wins");
    assert_eq!(value(&args, "--server"), Some("https://10.0.0.1:6443"));
    assert!(value(&args, "--log").unwrap().starts_with("debug"));
    let said = format!("{notices:?}");
    assert!(said.contains("--masquerade-all: --config's file replaces"), "{said}");
    assert!(said.contains("--log-dir"), "{said}");
}

#[test]
fn flags_alone_describe_the_configuration() {
    let (args, _) = run(os(&[
        "kpng",
        "kube-proxy",
        "--proxy-mode=nftables",
        "--kubeconfig=/etc/kp.conf",
        "--hostname-override=n1",
        "--cluster-cidr=10.244.0.0/16,fd00::/48",
        "--nodeport-addresses=192.168.0.0/16",
        "--iptables-min-sync-period=2s",
        "--metrics-bind-address=",
    ]));
    assert_eq!(args[1..4], ["kube", "--kubeconfig", "/etc/kp.conf"]);
    assert_eq!(value(&args, "to-local"), Some("to-nft"));
    assert_eq!(value(&args, "--cluster-cidr"), Some("10.244.0.0/16,fd00::/48"));
    assert_eq!(value(&args, "--detect-local-mode"), Some("ClusterCIDR"));
    assert_eq!(value(&args, "--nodeport-addresses"), Some("192.168.0.0/16"));
    assert_eq!(value(&args, "--min-sync-period"), Some("2000ms"));
    assert_eq!(value(&args, "--metrics-bind-address"), Some("127.0.0.1:0"), "empty: not served");
    assert_eq!(value(&args, "--exit-on-change"), None);
    assert_eq!(value(&args, "--node-ip"), None, "bindAddress 0.0.0.0 names no address");
    let (args, _) =
        run(os(&["kube-proxy", "--bind-address=192.168.10.50", "--hostname-override=n"]));
    assert_eq!(value(&args, "--node-ip"), Some("192.168.10.50"));
}

#[test]
fn kpngs_own_command_line_passes_through_and_help_and_version_print() {
    let own = os(&["kpng", "file", "--input", "x.yaml", "to-json"]);
    assert!(matches!(entry(own.clone()).unwrap(), Entry::Kpng(args) if args == own));
    let Entry::Print(help) = entry(os(&["kube-proxy", "-h"])).unwrap() else { panic!() };
    assert!(help.contains("--iptables-localhost-nodeports") && !help.contains("--healthz-port"));
    let Entry::Print(version) = entry(os(&["kube-proxy", "--version"])).unwrap() else { panic!() };
    assert!(version.contains("kpng"), "{version}");
    let error = entry(os(&["kube-proxy", "--proxy-port-range=1-2"])).unwrap_err();
    assert!(error.contains("--proxy-port-range"), "{error}");
}

#[test]
fn write_config_to_writes_the_defaulted_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("written.yaml");
    let args = os(&[
        "kube-proxy",
        "--proxy-mode=nftables",
        &format!("--write-config-to={}", out.display()),
    ]);
    assert!(matches!(entry(args).unwrap(), Entry::Print(text) if text.is_empty()));
    let written = std::fs::read_to_string(&out).unwrap();
    let decoded = config::decode(&written).unwrap();
    assert!(decoded.lenient.is_empty());
    let c = decoded.configuration;
    assert_eq!(c.mode.as_deref(), Some("nftables"));
    assert_eq!(c.node_port_addresses, Some(vec!["primary".to_string()]));
    assert_eq!(c.healthz_bind_address.as_deref(), Some("0.0.0.0:10256"));
}

#[test]
fn kpngs_own_config_file_works_under_the_kube_proxy_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kpng.yaml");
    std::fs::write(&path, "sync-period: 1m\n").unwrap();
    let (args, _) =
        run(os(&["kube-proxy", &format!("--config={}", path.display()), "--hostname-override=n"]));
    assert_eq!(value(&args, "--config"), path.to_str());
}

#[test]
fn kube_proxys_rules_go_and_cleanup_and_init_only_are_kpngs() {
    let (_dir, args) = kubeadm(KUBEADM);
    let (run_args, _) = run(args.clone());
    assert!(run_args.contains(&"--remove-kube-proxy".to_string()));
    assert!(!run_args.contains(&"--init-only".to_string()));
    let mut init = args.clone();
    init.push("--init-only".into());
    assert!(run(init).0.contains(&"--init-only".to_string()));
    let mut cleanup = args;
    cleanup.push("--cleanup".into());
    assert_eq!(run(cleanup).0[1..], ["cleanup", "--kube-proxy"]);
}
