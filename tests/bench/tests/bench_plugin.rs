//! `capstan-bench-plugin` as its users run it: every figure printed as a
//! `name value` line, each a positive number.

use capstan_e2e::plugin;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_capstan-bench-plugin"));
    cmd.args(args).env("RUST_LOG", "error");
    cmd
}

async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("capstan-bench-plugin runs"))
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_prints_every_figure_as_name_value_lines() {
    let p = plugin("sim_provider").display().to_string();
    let out = run(bench(&[
        "--plugin",
        &p,
        "--calls",
        "30",
        "--instantiations",
        "20",
        "--compiles",
        "1",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let figures: std::collections::HashMap<&str, f64> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("not `name value`: {l}"));
            (
                name,
                value
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("not a number: {l}")),
            )
        })
        .collect();
    for name in [
        "compile_ms",
        "load_precompiled_ms",
        "ratio_compile_vs_precompiled_load",
        "instantiate_us_p50",
        "instantiate_us_p99",
        "create_wasm_us_p50",
        "create_wasm_us_p99",
        "create_native_us_p50",
        "create_webhook_us_p50",
        "ratio_create_wasm_vs_native_p50",
        "ratio_create_webhook_vs_wasm_p50",
        "validate_wasm_us_p50",
        "ratio_validate_wasm_vs_native_p50",
    ] {
        let v = figures
            .get(name)
            .unwrap_or_else(|| panic!("missing {name} in:\n{stdout}"));
        assert!(v.is_finite() && *v > 0.0, "{name} = {v}");
    }
}
