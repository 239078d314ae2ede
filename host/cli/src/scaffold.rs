//! `capstan plugin new --lang rust|python|js --world provider|updater|addon
//! NAME`: a new plugin project, buildable, with its tests, made from the
//! repository's sample plugin for that language and world (the samples are
//! built and tested by the test suite, so a scaffold starts from working
//! code). Every language has a sample for every world (a unit test keeps
//! it so).

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The plugin's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// The contract world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorldArg {
    Provider,
    Updater,
    Addon,
}

/// Arguments of `capstan plugin new`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  capstan plugin new --lang python --world provider my-cloud
  capstan plugin new --lang js --world addon my-addon --dir ~/src/my-addon
Each project has a build script (or `cargo build`) and tests; the printed
next steps say which commands run them.")]
pub struct Args {
    /// The plugin's name (its manifest name): 1-63 lowercase letters, digits or '-'.
    pub name: String,
    /// The language to write it in.
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// The contract world it implements.
    #[arg(long, value_enum)]
    pub world: WorldArg,
    /// Where to create it (default: ./NAME). Must not exist yet.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A Capstan checkout's `sdk/` folder (the Rust crate, sdk/python and
    /// sdk/js; `wit/` beside it). Default: the checkout this binary was built from.
    #[arg(long, env = "CAPSTAN_SDK")]
    pub sdk: Option<PathBuf>,
}

/// One sample a scaffold is made from.
struct Sample {
    lang: Lang,
    world: WorldArg,
    /// The sample's name, replaced by the new plugin's.
    name: &'static str,
    manifest: &'static str,
    /// (path in the new project, contents)
    files: &'static [(&'static str, &'static str)],
}

const SAMPLES: &[Sample] = &[
    Sample {
        lang: Lang::Rust,
        world: WorldArg::Provider,
        name: "sim-provider",
        manifest: include_str!("../../../plugins/sim-provider/capstan-plugin.json"),
        files: &[(
            "src/lib.rs",
            include_str!("../../../plugins/sim-provider/src/lib.rs"),
        )],
    },
    Sample {
        lang: Lang::Rust,
        world: WorldArg::Updater,
        name: "sim-updater",
        manifest: include_str!("../../../plugins/sim-updater/capstan-plugin.json"),
        files: &[(
            "src/lib.rs",
            include_str!("../../../plugins/sim-updater/src/lib.rs"),
        )],
    },
    Sample {
        lang: Lang::Rust,
        world: WorldArg::Addon,
        name: "node-exporter",
        manifest: include_str!("../../../plugins/node-exporter-addon/capstan-plugin.json"),
        files: &[(
            "src/lib.rs",
            include_str!("../../../plugins/node-exporter-addon/src/lib.rs"),
        )],
    },
    Sample {
        lang: Lang::Python,
        world: WorldArg::Provider,
        name: "sim-provider-py",
        manifest: include_str!("../../../plugins/sim-provider-py/capstan-plugin.json"),
        files: &[
            (
                "app.py",
                include_str!("../../../plugins/sim-provider-py/app.py"),
            ),
            (
                "test_app.py",
                include_str!("../../../plugins/sim-provider-py/test_app.py"),
            ),
        ],
    },
    Sample {
        lang: Lang::Python,
        world: WorldArg::Updater,
        name: "sim-updater-py",
        manifest: include_str!("../../../plugins/sim-updater-py/capstan-plugin.json"),
        files: &[
            (
                "app.py",
                include_str!("../../../plugins/sim-updater-py/app.py"),
            ),
            (
                "test_app.py",
                include_str!("../../../plugins/sim-updater-py/test_app.py"),
            ),
        ],
    },
    Sample {
        lang: Lang::Python,
        world: WorldArg::Addon,
        name: "node-exporter-py",
        manifest: include_str!("../../../plugins/node-exporter-py/capstan-plugin.json"),
        files: &[
            (
                "app.py",
                include_str!("../../../plugins/node-exporter-py/app.py"),
            ),
            (
                "test_app.py",
                include_str!("../../../plugins/node-exporter-py/test_app.py"),
            ),
        ],
    },
    Sample {
        lang: Lang::Js,
        world: WorldArg::Updater,
        name: "sim-updater-js",
        manifest: include_str!("../../../plugins/sim-updater-js/capstan-plugin.json"),
        files: &[
            (
                "updater.js",
                include_str!("../../../plugins/sim-updater-js/updater.js"),
            ),
            (
                "test/updater.test.js",
                include_str!("../../../plugins/sim-updater-js/test/updater.test.js"),
            ),
        ],
    },
    Sample {
        lang: Lang::Js,
        world: WorldArg::Provider,
        name: "sim-provider-js",
        manifest: include_str!("../../../plugins/sim-provider-js/capstan-plugin.json"),
        files: &[
            (
                "provider.js",
                include_str!("../../../plugins/sim-provider-js/provider.js"),
            ),
            (
                "test/provider.test.js",
                include_str!("../../../plugins/sim-provider-js/test/provider.test.js"),
            ),
        ],
    },
    Sample {
        lang: Lang::Js,
        world: WorldArg::Addon,
        name: "node-exporter-js",
        manifest: include_str!("../../../plugins/node-exporter-js/capstan-plugin.json"),
        files: &[
            (
                "addon.js",
                include_str!("../../../plugins/node-exporter-js/addon.js"),
            ),
            (
                "test/addon.test.js",
                include_str!("../../../plugins/node-exporter-js/test/addon.test.js"),
            ),
        ],
    },
];

fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "rust",
        Lang::Python => "python",
        Lang::Js => "js",
    }
}

fn world_name(world: WorldArg) -> &'static str {
    match world {
        WorldArg::Provider => "provider",
        WorldArg::Updater => "updater",
        WorldArg::Addon => "addon",
    }
}

/// The checkout this binary was built from, if it is still there.
fn built_from_sdk() -> Option<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
    sdk.join("Cargo.toml")
        .exists()
        .then(|| sdk.canonicalize().unwrap_or(sdk))
}

/// Run the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let manifest_name = args.name.as_str();
    if manifest_name.is_empty()
        || manifest_name.len() > 63
        || !manifest_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || manifest_name.starts_with('-')
    {
        bail!(
            "NAME: `{manifest_name}` must be 1-63 lowercase letters, digits or '-', not starting with '-'"
        );
    }
    let Some(sample) = SAMPLES
        .iter()
        .find(|s| s.lang == args.lang && s.world == args.world)
    else {
        let there: Vec<String> = SAMPLES
            .iter()
            .map(|s| {
                format!(
                    "--lang {} --world {}",
                    lang_name(s.lang),
                    world_name(s.world)
                )
            })
            .collect();
        bail!(
            "there is no {} {} sample to start from yet; available: {}",
            lang_name(args.lang),
            world_name(args.world),
            there.join("; ")
        );
    };
    let sdk = match args.sdk.clone().or_else(built_from_sdk) {
        Some(sdk) => sdk,
        None => bail!(
            "cannot find the Capstan SDK: pass --sdk DIR (a Capstan checkout's sdk/ folder) or set CAPSTAN_SDK"
        ),
    };
    let sdk = sdk.canonicalize().unwrap_or(sdk);
    let wit = sdk.join("../wit");
    let wit = wit.canonicalize().unwrap_or(wit);
    anyhow::ensure!(
        wit.join("capstan-plugin.wit").exists(),
        "{} has no ../wit/capstan-plugin.wit: --sdk must be a Capstan checkout's sdk/ folder",
        sdk.display()
    );
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(manifest_name));
    if dir.exists() {
        bail!(
            "{} already exists; choose another --dir (nothing was written)",
            dir.display()
        );
    }
    let files = project(sample, manifest_name, args.lang, args.world, &sdk, &wit);
    // Write into a sibling first, then rename: a failure leaves nothing.
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let staging = parent.join(format!(".{manifest_name}.new-{}", std::process::id()));
    let written = write_all(&staging, &files).and_then(|()| {
        std::fs::rename(&staging, &dir).with_context(|| format!("cannot create {}", dir.display()))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    println!(
        "Created {} ({} {} plugin `{manifest_name}`, from the `{}` sample):",
        dir.display(),
        lang_name(args.lang),
        world_name(args.world),
        sample.name
    );
    for (path, _) in &files {
        println!("  {path}");
    }
    println!("\nNext:\n{}", next_steps(args.lang, &dir, manifest_name));
    Ok(ExitCode::SUCCESS)
}

fn write_all(root: &Path, files: &[(String, String)]) -> anyhow::Result<()> {
    for (path, contents) in files {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, contents)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// The project's files: the sample's, renamed, and what builds them.
fn project(
    sample: &Sample,
    name: &str,
    lang: Lang,
    world: WorldArg,
    sdk: &Path,
    wit: &Path,
) -> Vec<(String, String)> {
    let manifest = sample.manifest.replacen(
        &format!("\"name\": \"{}\"", sample.name),
        &format!("\"name\": \"{name}\""),
        1,
    );
    let mut files = vec![("capstan-plugin.json".to_string(), manifest)];
    files.extend(
        sample
            .files
            .iter()
            .map(|(p, c)| (p.to_string(), c.to_string())),
    );
    let stem = name.replace('-', "_");
    let (sdk, wit) = (sdk.display().to_string(), wit.display().to_string());
    match lang {
        Lang::Rust => files.push(rust_cargo_toml(name, &sdk)),
        Lang::Python => files.extend(python_scripts(&stem, world, &sdk, &wit)),
        Lang::Js => files.extend(js_build_files(sample, name, &stem, world, &sdk, &wit)),
    }
    files
}

/// A Rust plugin's `Cargo.toml`: a workspace of its own, the SDK by path.
fn rust_cargo_toml(name: &str, sdk: &str) -> (String, String) {
    (
        "Cargo.toml".into(),
        format!(
            r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[features]
default = ["export"]
# Export the component's world; off, the logic is a plain Rust library.
export = []

[dependencies]
capstan-sdk = {{ path = "{sdk}" }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

# A project of its own, wherever it is created.
[workspace]
"#
        ),
    )
}

/// A Python plugin's `build.sh` (componentize-py, then `capstan plugin
/// annotate`) and `test.sh` (its tests on CPython against the bindings).
fn python_scripts(stem: &str, world: WorldArg, sdk: &str, wit: &str) -> Vec<(String, String)> {
    let mut files = vec![];
    let world = match world {
        WorldArg::Provider => "provider-http-plugin",
        WorldArg::Updater => "updater-http-plugin",
        WorldArg::Addon => "addon-plugin",
    };
    files.push((
            "build.sh".into(),
            format!(
                r#"#!/usr/bin/env bash
# Build {stem}.wasm: componentize-py for the `{world}` world, then embed
# capstan-plugin.json with `capstan plugin annotate`.
# Needs componentize-py 0.25.1 (`pip install componentize-py==0.25.1`) and capstan.
set -euo pipefail
cd "$(dirname "$0")"
SDK="${{CAPSTAN_SDK:-{sdk}}}"
WIT="${{CAPSTAN_WIT:-{wit}}}"
"${{COMPONENTIZE_PY:-componentize-py}}" -d "$WIT" -w {world} componentize app -p . -p "$SDK/python" -o {stem}.component.wasm
"${{CAPSTAN:-capstan}}" plugin annotate {stem}.component.wasm -m capstan-plugin.json -o {stem}.wasm
"#
            ),
        ));
    files.push((
            "test.sh".into(),
            format!(
                r#"#!/usr/bin/env bash
# Run test_*.py on CPython against the bindings componentize-py generates.
set -euo pipefail
cd "$(dirname "$0")"
SDK="${{CAPSTAN_SDK:-{sdk}}}"
WIT="${{CAPSTAN_WIT:-{wit}}}"
bindings="$(mktemp -d)"
trap 'rm -rf "$bindings"' EXIT
"${{COMPONENTIZE_PY:-componentize-py}}" -d "$WIT" -w {world} bindings "$bindings" >/dev/null
PYTHONPATH="$bindings:$SDK/python:." PYTHONDONTWRITEBYTECODE=1 "${{PYTHON:-python3}}" -m unittest discover -s .
"#
            ),
        ));
    files
}

/// A JavaScript plugin's `package.json`, rolldown config and `build.sh`
/// (bundle, componentize-js, then `capstan plugin annotate`).
fn js_build_files(
    sample: &Sample,
    name: &str,
    stem: &str,
    world: WorldArg,
    sdk: &str,
    wit: &str,
) -> Vec<(String, String)> {
    let mut files = vec![];
    let entry = sample.files.first().map(|(p, _)| *p).unwrap_or("index.js");
    files.push((
        "package.json".into(),
        format!(
            r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "main": "{entry}",
  "scripts": {{
    "test": "node --import @capstan/plugin/testing --test test/",
    "build": "./build.sh"
  }},
  "dependencies": {{
    "@capstan/plugin": "file:{sdk}/js"
  }},
  "devDependencies": {{
    "@bytecodealliance/componentize-js": "0.23.0",
    "rolldown": "1.3.2"
  }}
}}
"#
        ),
    ));
    files.push((
        "rolldown.config.mjs".into(),
        format!(
            r#"// One module for componentize-js: the plugin and the SDK bundled, WIT
// imports (`capstan:plugin/log@0.1.0`) left as imports.
export default {{
  input: '{entry}',
  external: (id) => /^[a-z][a-z0-9-]*:[a-z][a-z0-9-]*\//.test(id),
  output: {{ file: 'bundle.js', format: 'esm' }},
}};
"#
        ),
    ));
    files.push((
            "build.sh".into(),
            format!(
                r#"#!/usr/bin/env bash
# Build {stem}.wasm: bundle with rolldown, componentize-js for the
# `{world}-plugin` world, then embed capstan-plugin.json with
# `capstan plugin annotate`. Run `npm install` first.
set -euo pipefail
cd "$(dirname "$0")"
WIT="${{CAPSTAN_WIT:-{wit}}}"
./node_modules/.bin/rolldown -c rolldown.config.mjs
./node_modules/.bin/componentize-js bundle.js --wit "$WIT" --world-name {world}-plugin -o {stem}.component.wasm
"${{CAPSTAN:-capstan}}" plugin annotate {stem}.component.wasm -m capstan-plugin.json -o {stem}.wasm
"#,
                world = world_name(world)
            ),
        ));
    files
}

fn next_steps(lang: Lang, dir: &Path, name: &str) -> String {
    let dir = dir.display();
    let stem = name.replace('-', "_");
    match lang {
        Lang::Rust => format!(
            "  cd {dir}\n  cargo test                                          # the unit tests\n  cargo build --release --target wasm32-wasip2        # target/wasm32-wasip2/release/{stem}.wasm\n  capstan plugin conformance target/wasm32-wasip2/release/{stem}.wasm --help"
        ),
        Lang::Python => format!(
            "  cd {dir}\n  ./test.sh                                           # the unit tests (CPython)\n  ./build.sh                                          # {stem}.wasm\n  capstan plugin conformance {stem}.wasm --help"
        ),
        Lang::Js => format!(
            "  cd {dir}\n  npm install\n  npm test                                            # the unit tests (Node)\n  ./build.sh                                          # {stem}.wasm\n  capstan plugin conformance {stem}.wasm --help"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_has_a_sample_for_every_world() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            for world in [WorldArg::Provider, WorldArg::Updater, WorldArg::Addon] {
                let n = SAMPLES
                    .iter()
                    .filter(|s| s.lang == lang && s.world == world)
                    .count();
                assert_eq!(n, 1, "{} {}", lang_name(lang), world_name(world));
            }
        }
    }

    #[test]
    fn every_sample_gets_the_new_name_and_a_way_to_build() {
        let sdk = Path::new("/sdk");
        let wit = Path::new("/wit");
        for sample in SAMPLES {
            let files = project(sample, "my-plugin", sample.lang, sample.world, sdk, wit);
            let manifest = &files
                .iter()
                .find(|(p, _)| p == "capstan-plugin.json")
                .unwrap()
                .1;
            let parsed = capstan_manifest::PluginManifest::from_json(manifest.as_bytes()).unwrap();
            assert_eq!(parsed.name, "my-plugin", "{}", sample.name);
            assert_eq!(parsed.world.as_str(), world_name(sample.world));
            let builder = match sample.lang {
                Lang::Rust => "Cargo.toml",
                Lang::Python | Lang::Js => "build.sh",
            };
            assert!(files.iter().any(|(p, _)| p == builder), "{}", sample.name);
        }
    }
}
