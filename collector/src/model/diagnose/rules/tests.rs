//! The table against docs/OOM.md, and each rule deciding where it should.

use super::super::evidence::{CacheFrag, Evidence, Grew};
use super::super::{GrowthOf, Limit};
use super::*;
use crate::model::analysis::{GrowthUnit, LeakTrend};

const GIB: u64 = 1 << 30;

/// docs/OOM.md's list of the rules, "The cause: exactly one, first rule that holds", up to the next section.
fn documented() -> &'static str {
    let doc = include_str!("../../../../../docs/OOM.md");
    let start = doc
        .find("## The cause: exactly one, first rule that holds")
        .expect("docs/OOM.md lists the rules");
    let rest = &doc[start + 2..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// Every rule has exactly one row, and its own key.
#[test]
fn every_rule_has_one_row_and_its_own_key() {
    // Exhaustive: a new rule does not compile here until it is given a place.
    let place = |r: Rule| match r {
        Rule::HostMemory => 0,
        Rule::RequestExceedsLimit => 1,
        Rule::CacheFragmented => 2,
        Rule::Growth => 3,
        Rule::FrameworkLimit => 4,
        Rule::CapRefused => 5,
        Rule::OverCap => 6,
        Rule::FreeAtLeastRequest => 7,
        Rule::PoolCachedAsyncFrees => 8,
        Rule::OutsideExcess => 9,
        Rule::JobFillsDevice => 10,
        Rule::NoDriverFiguresPool => 11,
        Rule::NoDriverFiguresFitsTotal => 12,
        Rule::NoDriverFigures => 13,
    };
    let places: Vec<usize> = RULES.iter().map(|r| place(r.rule)).collect();
    assert_eq!(places, (0..14).collect::<Vec<_>>());
    let mut keys: Vec<&str> = RULES.iter().map(|r| r.rule.key()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), RULES.len(), "two rules share a key: {keys:?}");
}

/// The table is tried in the order docs/OOM.md states, and each rule gives the cause the docs name beside it
/// (`**cause**, `rule`` or `**cause** (`rule`)`).
#[test]
fn table_is_the_documented_precedence() {
    let doc = documented();
    let mut last = 0;
    for r in &RULES {
        let key = format!("`{}`", r.rule.key());
        let at = doc
            .find(&key)
            .unwrap_or_else(|| panic!("docs/OOM.md does not list rule {key}"));
        assert!(
            at > last,
            "rule {key} comes before the rule above it in docs/OOM.md"
        );
        last = at;
        let before = &doc[..at];
        let close = before.rfind("**").expect("a cause in bold before the rule");
        let open = before[..close].rfind("**").expect("a cause in bold") + 2;
        assert_eq!(
            &before[open..close],
            r.rule.cause().key(),
            "docs/OOM.md names another cause for rule {key}"
        );
    }
}

/// A growth of `rise` bytes in counted steps.
fn grew(rise: u64) -> Option<Grew> {
    Some(Grew {
        trend: LeakTrend {
            minima: Vec::new(),
            rise_bytes: rise,
            steps: Some(4),
            unit: GrowthUnit::Cycles,
            pid: None,
            groups: Vec::new(),
            more_groups: 0,
            sites: Vec::new(),
            more_sites: 0,
        },
        of: GrowthOf::JobInUse,
    })
}

/// With the driver's free memory known: free, the shortfall, and outside the job on an 80 GiB device.
fn with_free(job: u64, req: u64, free: u64) -> Evidence {
    let outside = (80 * GIB).saturating_sub(free).saturating_sub(job);
    Evidence {
        req,
        job,
        free: Some(free),
        total: Some(80 * GIB),
        known_total: Some(80 * GIB),
        shortfall: Some(req.saturating_sub(free)),
        outside: Some(outside),
        excess: Some(outside),
        ..Evidence::default()
    }
}

/// Each case holds for its own rule and for rules after it: the first must decide.
#[test]
fn first_rule_that_holds_decides() {
    let cases: Vec<(Rule, Evidence)> = vec![
        (
            Rule::HostMemory,
            Evidence {
                on_host: true,
                cap_refused: true,
                req: 2 * GIB,
                limit_alone: Some((GIB, Limit::Device)),
                ..Evidence::default()
            },
        ),
        (
            Rule::RequestExceedsLimit,
            Evidence {
                cap_refused: true,
                req: 2 * GIB,
                limit_alone: Some((GIB, Limit::Cap)),
                grew: grew(4 * GIB),
                ..Evidence::default()
            },
        ),
        (
            Rule::CacheFragmented,
            Evidence {
                cap_refused: true,
                req: GIB,
                cache_frag: Some(CacheFrag {
                    reserved: 8 * GIB,
                    allocated: 6 * GIB,
                    cached: 2 * GIB,
                    short: GIB,
                    largest_free_block: GIB / 2,
                }),
                grew: grew(4 * GIB),
                ..Evidence::default()
            },
        ),
        (
            Rule::Growth,
            Evidence {
                cap_refused: true,
                grew: grew(4 * GIB),
                ..with_free(10 * GIB, GIB, 0)
            },
        ),
        (
            Rule::FrameworkLimit,
            Evidence {
                // Before the cap's rules: a framework that never asked the driver was not refused by the cap.
                cap: Some(GIB),
                framework_limit: Some(super::super::evidence::FrameworkLimit {
                    framework: vramtrace_format::Framework::Jax,
                    limit: 6 * GIB,
                    in_use: 5 * GIB,
                    reserved: 6 * GIB,
                    largest_free_block: Some(GIB / 2),
                }),
                ..Evidence {
                    req: GIB,
                    job: 6 * GIB,
                    ..Evidence::default()
                }
            },
        ),
        (
            Rule::CapRefused,
            Evidence {
                cap_refused: true,
                cap: Some(4 * GIB),
                ..with_free(4 * GIB, GIB, 70 * GIB)
            },
        ),
        (
            Rule::OverCap,
            Evidence {
                cap: Some(4 * GIB),
                ..with_free(4 * GIB, GIB, 70 * GIB)
            },
        ),
        (
            Rule::FreeAtLeastRequest,
            Evidence {
                recent: 4 * GIB,
                ..with_free(4 * GIB, GIB, 2 * GIB)
            },
        ),
        (
            Rule::PoolCachedAsyncFrees,
            Evidence {
                recent: GIB / 2,
                ..with_free(4 * GIB, GIB, GIB / 2)
            },
        ),
        (Rule::OutsideExcess, with_free(40 * GIB, GIB, GIB / 2)),
        (Rule::JobFillsDevice, with_free(80 * GIB, GIB, 0)),
        (
            Rule::NoDriverFiguresPool,
            Evidence {
                req: GIB,
                job: GIB,
                known_total: Some(80 * GIB),
                recent: GIB,
                ..Evidence::default()
            },
        ),
        (
            Rule::NoDriverFiguresFitsTotal,
            Evidence {
                req: GIB,
                job: GIB,
                known_total: Some(80 * GIB),
                recent: GIB / 2,
                ..Evidence::default()
            },
        ),
        (
            Rule::NoDriverFigures,
            Evidence {
                req: GIB,
                job: 80 * GIB,
                known_total: Some(80 * GIB),
                recent: 4 * GIB,
                ..Evidence::default()
            },
        ),
        (Rule::NoDriverFigures, Evidence::default()),
    ];
    let mut seen: Vec<Rule> = cases.iter().map(|(r, _)| *r).collect();
    seen.dedup();
    assert_eq!(seen.len(), RULES.len(), "a case for every rule");
    for (rule, e) in &cases {
        let reason = decide(e);
        assert_eq!(reason.rule(), *rule, "{e:?}");
        assert_eq!(reason.cause(), rule.cause());
    }
}

/// The last rule is the last resort: it holds on any evidence, so `decide` never falls out of the table.
#[test]
fn last_rule_always_holds() {
    let last = RULES.last().expect("rules");
    assert_eq!(last.rule, Rule::NoDriverFigures);
    for e in [
        Evidence::default(),
        with_free(GIB, GIB, GIB),
        Evidence {
            known_total: Some(GIB),
            ..Evidence::default()
        },
    ] {
        assert!((last.holds)(&e).is_some(), "{e:?}");
    }
}

#[test]
fn only_the_pool_rules_read_the_pool_cache() {
    let pool: Vec<Rule> = RULES
        .iter()
        .map(|r| r.rule)
        .filter(|r| r.reads_pool_cache())
        .collect();
    assert_eq!(
        pool,
        [Rule::PoolCachedAsyncFrees, Rule::NoDriverFiguresPool]
    );
}

/// A framework that refused within its limit while it could still grow (JAX without preallocation): the driver
/// refused it the growth, and the driver's rules decide; over its limit, or within a limit it held whole, its own.
#[test]
fn a_framework_limit_decides_only_where_it_bound() {
    let at = |in_use: u64, reserved: u64| Evidence {
        req: GIB,
        job: reserved,
        known_total: Some(80 * GIB),
        framework_limit: Some(super::super::evidence::FrameworkLimit {
            framework: vramtrace_format::Framework::Jax,
            limit: 60 * GIB,
            in_use,
            reserved,
            largest_free_block: Some(GIB / 2),
        }),
        ..Evidence::default()
    };
    assert_ne!(decide(&at(10 * GIB, 12 * GIB)).rule(), Rule::FrameworkLimit);
    assert_eq!(decide(&at(10 * GIB, 60 * GIB)).rule(), Rule::FrameworkLimit);
    assert_eq!(
        decide(&at(59 * GIB + GIB / 2, 59 * GIB + GIB / 2)).rule(),
        Rule::FrameworkLimit
    );
}
