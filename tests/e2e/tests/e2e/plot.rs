//! The scale benchmark's SVG chart (`capstan_e2e::plot`): pure, no cluster;
//! here because the e2e library builds no test harness of its own.

use capstan_e2e::plot::{Panel, svg};

fn panel() -> Panel {
    Panel {
        title: "seconds to all Ready".into(),
        series: vec![
            ("wasm".into(), vec![(5000.0, 90.0), (1000.0, 18.0)]),
            ("native".into(), vec![(1000.0, 16.0), (5000.0, 80.0)]),
        ],
    }
}

/// The x coordinates of a `<polyline>` line.
fn xs(line: &str) -> Vec<f64> {
    line.split('"')
        .nth(1)
        .unwrap()
        .split(' ')
        .map(|p| p.split(',').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn every_point_is_drawn_in_fleet_order_within_its_panel() {
    let doc = svg("capstan-bench-scale <test>", &[panel(), panel()]);
    assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
    assert!(
        doc.contains("capstan-bench-scale &lt;test&gt;"),
        "caption escaped"
    );
    assert_eq!(
        doc.matches("<polyline").count(),
        4,
        "one line per series and panel"
    );
    assert_eq!(doc.matches("<circle").count(), 8, "one marker per point");
    assert!(doc.contains("<title>1000 machines: 18</title>"), "{doc}");
    // x runs left to right by fleet size, and each panel keeps to its
    // place: the first panel's points all left of the second's.
    let lines: Vec<&str> = doc.lines().filter(|l| l.contains("<polyline")).collect();
    let (first, second) = (xs(lines[0]), xs(lines[2]));
    assert!(first[0] < first[1], "points sorted by machines: {first:?}");
    assert!(
        first.iter().all(|a| second.iter().all(|b| a < b)),
        "first panel stays left: {first:?} vs {second:?}"
    );
}

#[test]
fn empty_panels_draw_without_dividing_by_zero() {
    let doc = svg(
        "empty",
        &[Panel {
            title: "nothing".into(),
            series: vec![("wasm".into(), vec![])],
        }],
    );
    assert!(!doc.contains("NaN") && !doc.contains("inf"));
}
