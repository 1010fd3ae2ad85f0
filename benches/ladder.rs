//! Testbed throughput: episodes generated, and episodes generated, run and
//! scored with the scripted perfect agent, per arm (S = 10, ρ = 0.15).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::generate;
use statebench::ladder::episode::EpisodeConfig;
use statebench::ladder::parts::scripted::OracleMatcher;
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::parts::MemoryParts;
use statebench::ladder::run::runner::{run_episode, Compiled, RunOptions};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ladder");
    g.throughput(Throughput::Elements(1));
    let mut seed = 100u64;
    g.bench_function("generate", |b| {
        b.iter(|| {
            seed += 1;
            generate(
                &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, seed),
                None,
            )
            .unwrap()
        })
    });
    for arm in Arm::ALL {
        g.bench_with_input(
            BenchmarkId::new("generate+run+score", arm.name()),
            &arm,
            |b, &arm| {
                b.iter(|| {
                    seed += 1;
                    let ep = generate(
                        &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, seed),
                        None,
                    )
                    .unwrap();
                    let compiled = Compiled::oracle(&ep);
                    let (rec, _) = run_episode(
                        &ep,
                        arm,
                        &mut Scripted::Perfect,
                        &mut OracleMatcher,
                        &mut MemoryParts::scripted(),
                        Some(&compiled),
                        &RunOptions::default(),
                    );
                    assert!(rec.primary.strict);
                    rec
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
