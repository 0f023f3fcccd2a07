//! The `ordo crash` command line: JSON report, --state/--keep, merge.

use ordo_crash::cli::run;

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn json_report_and_state_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("s.scenario");
    std::fs::write(
        &scen,
        "preset\n---\ncreat /A/x\nwrite /A/x 0 4096\nfsync /A/x\n",
    )
    .unwrap();
    let json = dir.path().join("r.json");
    let code = run(&args(&[
        "--mode",
        "async",
        "--workload",
        scen.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--no-e2fsck",
        "-q",
    ]))
    .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for k in [
        "checked",
        "inconsistent",
        "broken_promises",
        "seed",
        "failures",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let checked = v["checked"].as_u64().unwrap();
    assert!(checked > 0);
    let failures = v["failures"].as_array().unwrap();
    assert_eq!(code == 0, failures.is_empty());
    // Rebuild one state (a failing one if any) and keep its images.
    let id = failures
        .first()
        .map(|f| f["state"].as_str().unwrap().to_string())
        .unwrap_or_else(|| "0.0.0".to_string());
    let keep = dir.path().join("keep");
    run(&args(&[
        "--mode",
        "async",
        "--workload",
        scen.to_str().unwrap(),
        "--state",
        &id,
        "--keep",
        keep.to_str().unwrap(),
        "-q",
    ]))
    .unwrap();
    for suffix in ["crash.img", "recovered.img", "scenario", "findings"] {
        let p = keep.join(format!("state-{id}.{suffix}"));
        assert!(p.exists(), "{} missing", p.display());
    }
    // The kept crash image is the size of the file system.
    let len = std::fs::metadata(keep.join(format!("state-{id}.crash.img")))
        .unwrap()
        .len();
    assert_eq!(len, 16 << 20);
}

#[test]
fn shards_and_merge_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("s.scenario");
    std::fs::write(&scen, "preset\n---\nmkdir /A/d\nfsync /A\n").unwrap();
    let mut outs = Vec::new();
    for i in 0..2 {
        let out = dir.path().join(format!("s{i}.json"));
        run(&args(&[
            "--mode",
            "sync",
            "--workload",
            scen.to_str().unwrap(),
            "--shard",
            &format!("{i}/2"),
            "--no-e2fsck",
            "--json",
            out.to_str().unwrap(),
            "-q",
        ]))
        .unwrap();
        outs.push(out.to_str().unwrap().to_string());
    }
    let merged = dir.path().join("m.json");
    let mut a = vec!["merge"];
    a.extend(outs.iter().map(|s| s.as_str()));
    a.extend(["--json", merged.to_str().unwrap()]);
    run(&args(&a)).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    let total = v["states_total"].as_u64().unwrap();
    assert_eq!(v["checked"].as_u64().unwrap(), total);
    assert!(run(&args(&["--mode", "sync"])).is_err());
    assert!(run(&args(&["--workload", "seq1", "--mode", "nope"])).is_err());
}
