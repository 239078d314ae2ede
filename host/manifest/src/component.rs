//! What a component is made of, read without running it: its imports and
//! exports, how many core instances, memories and tables one instantiation
//! holds ([`Footprint`]), and embedding the manifest into a component built
//! by any toolchain ([`embed_manifest`], behind `capstan plugin annotate`).
//!
//! Rust plugins get their manifest from the SDK's macro; Python
//! (componentize-py) and JavaScript (componentize-js) components are
//! annotated after they are built. Everything here is pure byte work.

use crate::{CUSTOM_SECTION, ManifestError, PluginManifest};
use wasmparser::{ComponentAlias, ComponentOuterAliasKind, Encoding, Instance, Parser, Payload};

/// What one instantiation of a component holds: every core module it
/// instantiates, and the memories and tables those modules define (imported
/// ones are shared, not allocated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub core_instances: usize,
    pub memories: usize,
    pub tables: usize,
}

impl Footprint {
    fn add(&mut self, other: Footprint) {
        self.core_instances += other.core_instances;
        self.memories += other.memories;
        self.tables += other.tables;
    }
}

/// One level of nesting while walking a component.
#[derive(Default)]
struct Frame {
    is_module: bool,
    /// A module: the memories and tables it defines.
    own: Footprint,
    /// A component: its core modules and nested components by index, with
    /// what instantiating each holds.
    modules: Vec<Footprint>,
    components: Vec<Footprint>,
    /// A component: what instantiating it holds.
    total: Footprint,
}

fn not_a_component(e: impl std::fmt::Display) -> ManifestError {
    ManifestError::NotAComponent(e.to_string())
}

/// Count what one instantiation of `component` holds.
pub fn footprint(component: &[u8]) -> Result<Footprint, ManifestError> {
    let mut stack: Vec<Frame> = Vec::new();
    for payload in Parser::new(0).parse_all(component) {
        match payload.map_err(not_a_component)? {
            Payload::Version { encoding, .. } => {
                if stack.is_empty() && encoding != Encoding::Component {
                    return Err(not_a_component(
                        "it is a core WebAssembly module; plugins must be components",
                    ));
                }
                stack.push(Frame {
                    is_module: encoding == Encoding::Module,
                    ..Frame::default()
                });
            }
            Payload::MemorySection(reader) => {
                if let Some(frame) = stack.last_mut() {
                    frame.own.memories += reader.count() as usize;
                }
            }
            Payload::TableSection(reader) => {
                if let Some(frame) = stack.last_mut() {
                    frame.own.tables += reader.count() as usize;
                }
            }
            Payload::InstanceSection(reader) => {
                let Some(frame) = stack.last_mut() else {
                    continue;
                };
                for instance in reader {
                    if let Instance::Instantiate { module_index, .. } =
                        instance.map_err(not_a_component)?
                    {
                        let module = frame
                            .modules
                            .get(module_index as usize)
                            .copied()
                            .unwrap_or_default();
                        frame.total.add(Footprint {
                            core_instances: 1,
                            ..module
                        });
                    }
                }
            }
            Payload::ComponentInstanceSection(reader) => {
                let Some(frame) = stack.last_mut() else {
                    continue;
                };
                for instance in reader {
                    if let wasmparser::ComponentInstance::Instantiate {
                        component_index, ..
                    } = instance.map_err(not_a_component)?
                    {
                        let nested = frame
                            .components
                            .get(component_index as usize)
                            .copied()
                            .unwrap_or_default();
                        frame.total.add(nested);
                    }
                }
            }
            Payload::ComponentAliasSection(reader) => {
                for alias in reader {
                    if let ComponentAlias::Outer { kind, count, index } =
                        alias.map_err(not_a_component)?
                    {
                        let depth = stack.len().checked_sub(1 + count as usize);
                        let outer = depth.and_then(|d| stack.get(d));
                        let found = match kind {
                            ComponentOuterAliasKind::CoreModule => outer.map(|f| &f.modules),
                            ComponentOuterAliasKind::Component => outer.map(|f| &f.components),
                            _ => continue,
                        }
                        .and_then(|list| list.get(index as usize).copied())
                        .unwrap_or_default();
                        let Some(frame) = stack.last_mut() else {
                            continue;
                        };
                        if kind == ComponentOuterAliasKind::CoreModule {
                            frame.modules.push(found);
                        } else {
                            frame.components.push(found);
                        }
                    }
                }
            }
            Payload::End(_) => {
                let Some(done) = stack.pop() else { continue };
                match stack.last_mut() {
                    Some(parent) if done.is_module => parent.modules.push(done.own),
                    Some(parent) => parent.components.push(done.total),
                    None => return Ok(done.total),
                }
            }
            _ => {}
        }
    }
    Err(not_a_component("the component ends early"))
}

/// The names a component imports and exports at its top level
/// (`wasi:http/outgoing-handler@0.2.6`, `capstan:plugin/addon@0.2.0`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interfaces {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Read a component's top-level imports and exports.
pub fn interfaces(component: &[u8]) -> Result<Interfaces, ManifestError> {
    let mut found = Interfaces::default();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        match payload.map_err(not_a_component)? {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err(not_a_component(
                        "it is a core WebAssembly module; plugins must be components",
                    ));
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(not_a_component)?;
                    found.imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(not_a_component)?;
                    found.exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(found)
}

/// What the host gives a component for an import, by interface; `None`
/// when the host does not provide it (the component would not link).
pub fn host_provides(import: &str) -> Option<&'static str> {
    let unversioned = import.split('@').next().unwrap_or(import);
    Some(match unversioned {
        "capstan:plugin/log" => "the host's log, tagged with the plugin; volume limited per call",
        "capstan:plugin/http" => {
            "one request per host call, to destinations the manifest declares and an admin grants; credentials attached by the host (contract 0.3.0)"
        }
        "capstan:plugin/types" | "capstan:plugin/bootstrap-types" => "contract types",
        "wasi:http/outgoing-handler" => {
            "requests to destinations the manifest declares and an admin grants; credentials attached by the host"
        }
        "wasi:http/types" => "HTTP request and response types",
        "wasi:cli/environment" => "an empty environment and no arguments",
        "wasi:cli/exit" => "exit ends the call as a trap",
        "wasi:cli/stdin" => "an empty stdin",
        "wasi:cli/stdout" | "wasi:cli/stderr" => {
            "captured, size limited, logged as the plugin's lines"
        }
        "wasi:cli/terminal-input"
        | "wasi:cli/terminal-output"
        | "wasi:cli/terminal-stdin"
        | "wasi:cli/terminal-stdout"
        | "wasi:cli/terminal-stderr" => "no terminal",
        "wasi:filesystem/preopens" => "nothing preopened",
        "wasi:filesystem/types" => "no files (nothing is preopened)",
        "wasi:sockets/network"
        | "wasi:sockets/instance-network"
        | "wasi:sockets/tcp"
        | "wasi:sockets/tcp-create-socket"
        | "wasi:sockets/udp"
        | "wasi:sockets/udp-create-socket"
        | "wasi:sockets/ip-name-lookup" => "every socket and name lookup denied",
        "wasi:clocks/monotonic-clock" | "wasi:clocks/wall-clock" => "the host's clocks",
        "wasi:random/random" | "wasi:random/insecure" | "wasi:random/insecure-seed" => {
            "the host's randomness"
        }
        "wasi:io/error" | "wasi:io/poll" | "wasi:io/streams" => "streams and polling",
        _ => return None,
    })
}

/// Embed `manifest_json` as the component's manifest, replacing any
/// manifest it already carries (at its top level or in a nested module),
/// and check the result: the manifest is valid, the component exports the
/// interface its world needs, and everything it imports is provided.
pub fn embed_manifest(component: &[u8], manifest_json: &[u8]) -> Result<Vec<u8>, ManifestError> {
    let manifest = PluginManifest::from_json(manifest_json)?;
    let found = interfaces(component)?;
    check_fits(&manifest, &found)?;
    let mut out = strip_manifests(component)?;
    let mut section = Vec::new();
    write_leb(&mut section, CUSTOM_SECTION.len());
    section.extend_from_slice(CUSTOM_SECTION.as_bytes());
    section.extend_from_slice(manifest_json);
    out.push(0);
    write_leb(&mut out, section.len());
    out.extend_from_slice(&section);
    // What the host will read back, through the same path it loads with.
    PluginManifest::from_component(&out)?;
    Ok(out)
}

/// Whether a component's interfaces fit what its manifest says: the world's
/// export is there and every import is one the host provides.
pub fn check_fits(manifest: &PluginManifest, found: &Interfaces) -> Result<(), ManifestError> {
    let export = manifest.world.export_interface(&manifest.contract);
    if !found.exports.contains(&export) {
        return Err(ManifestError::Invalid {
            field: "world".into(),
            reason: format!(
                "the manifest says world `{}` (contract {}) but the component does not export {export}; it exports {}",
                manifest.world,
                manifest.contract,
                if found.exports.is_empty() {
                    "nothing".into()
                } else {
                    found.exports.join(", ")
                }
            ),
        });
    }
    crate::contract_covers_imports(&manifest.contract, found.imports.iter().map(String::as_str))
        .map_err(|reason| ManifestError::Invalid {
            field: "contract".into(),
            reason,
        })?;
    let missing: Vec<&str> = found
        .imports
        .iter()
        .filter(|i| host_provides(i).is_none())
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(ManifestError::Invalid {
            field: "imports".into(),
            reason: format!(
                "the component imports {} which the host does not provide; it would not link",
                missing.join(", ")
            ),
        });
    }
    Ok(())
}

/// The component's bytes without any manifest section, in it or in the
/// modules and components nested in it.
fn strip_manifests(bytes: &[u8]) -> Result<Vec<u8>, ManifestError> {
    const HEADER: usize = 8;
    if bytes.len() < HEADER || &bytes[..4] != b"\0asm" {
        return Err(not_a_component("no WebAssembly header"));
    }
    // The layer field: 1 for a component, 0 for a core module (where
    // section ids 1 and 4 mean types and tables, not nested binaries).
    let is_component = bytes[6..8] == [1, 0];
    let mut out = bytes[..HEADER].to_vec();
    let mut at = HEADER;
    while at < bytes.len() {
        let id = bytes[at];
        let (size, leb) = read_leb(&bytes[at + 1..])?;
        let start = at + 1 + leb;
        let end = start
            .checked_add(size)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| not_a_component("a section runs past the end"))?;
        let body = &bytes[start..end];
        at = end;
        // Component sections 1 (core module) and 4 (component) nest whole
        // binaries; 0 is a custom section in modules and components alike.
        let kept = match id {
            0 if custom_name(body)? == CUSTOM_SECTION => continue,
            1 | 4 if is_component => strip_manifests(body)?,
            _ => body.to_vec(),
        };
        out.push(id);
        write_leb(&mut out, kept.len());
        out.extend_from_slice(&kept);
    }
    Ok(out)
}

fn custom_name(body: &[u8]) -> Result<&str, ManifestError> {
    let (len, leb) = read_leb(body)?;
    body.get(leb..leb + len)
        .and_then(|name| std::str::from_utf8(name).ok())
        .ok_or_else(|| not_a_component("a custom section's name is unreadable"))
}

fn read_leb(bytes: &[u8]) -> Result<(usize, usize), ManifestError> {
    let mut value = 0usize;
    for (i, byte) in bytes.iter().take(5).enumerate() {
        value |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err(not_a_component("a section size is unreadable"))
}

/// Append `value` as unsigned LEB128 (section sizes, name lengths).
pub fn write_leb(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb_round_trips() {
        for value in [0, 1, 127, 128, 300, 16_384, 12_081_312, u32::MAX as usize] {
            let mut out = Vec::new();
            write_leb(&mut out, value);
            assert_eq!(read_leb(&out).unwrap(), (value, out.len()));
        }
    }

    #[test]
    fn every_wasi_interface_the_toolchains_import_is_described() {
        for import in [
            "wasi:cli/environment@0.2.12",
            "wasi:filesystem/preopens@0.2.0",
            "wasi:sockets/tcp@0.2.3",
            "wasi:http/outgoing-handler@0.2.10",
            "capstan:plugin/log@0.1.0",
        ] {
            assert!(host_provides(import).is_some(), "{import}");
        }
        assert_eq!(host_provides("wasi:keyvalue/store@0.2.0"), None);
    }

    #[test]
    fn a_manifest_must_fit_the_exports_and_the_imports_must_be_provided() {
        let manifest = |world: &str| {
            let objects = if world == "addon" {
                r#","capabilities":{"objects":["Namespace"]}"#
            } else {
                ""
            };
            PluginManifest::from_json(
                format!(r#"{{"name":"p","version":"0.1.0","world":"{world}","contract":"0.2.0"{objects}}}"#)
                    .as_bytes(),
            )
            .unwrap()
        };
        let addon = Interfaces {
            imports: vec![
                "capstan:plugin/log@0.1.0".into(),
                "wasi:cli/environment@0.2.9".into(),
            ],
            exports: vec!["capstan:plugin/addon@0.2.0".into()],
        };
        check_fits(&manifest("addon"), &addon).unwrap();
        let err = check_fits(&manifest("provider"), &addon)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not export capstan:plugin/provider@0.2.0")
                && err.contains("it exports capstan:plugin/addon@0.2.0"),
            "{err}"
        );
        let mut keyvalue = addon.clone();
        keyvalue.imports.push("wasi:keyvalue/store@0.2.0".into());
        let err = check_fits(&manifest("addon"), &keyvalue)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("imports wasi:keyvalue/store@0.2.0 which the host does not provide"),
            "{err}"
        );
    }

    #[test]
    fn a_core_module_is_not_annotated() {
        let err = embed_manifest(
            b"\0asm\x01\0\0\0",
            br#"{"name":"p","version":"0.1.0","world":"provider","contract":"0.2.0"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("core WebAssembly module"), "{err}");
    }
}
