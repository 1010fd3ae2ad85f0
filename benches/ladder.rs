//! Testbed throughput: episodes generated, and episodes generated, run and
//! scored with the scripted perfect agent, per arm (S = 10, ρ = 0.15).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use statebench::ladder::agent::Scripted;
use statebench::ladder::arm::Arm;
use statebench::ladder::domain::Domain;
use statebench::ladder::generator::{config, generate};
use statebench::ladder::module::OracleMatcher;
use statebench::ladder::runner::{run_episode, Compiled, RunOptions};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ladder");
    g.throughput(Throughput::Elements(1));
    let mut seed = 100u64;
    g.bench_function("generate", |b| {
        b.iter(|| {
            seed += 1;
            generate(&config(Domain::Procurement, 10, 0.15, seed), None).unwrap()
        })
    });
    for arm in Arm::ALL {
        g.bench_with_input(
            BenchmarkId::new("generate+run+score", arm.name()),
            &arm,
            |b, &arm| {
                b.iter(|| {
                    seed += 1;
                    let ep = generate(&config(Domain::Procurement, 10, 0.15, seed), None).unwrap();
                    let compiled = Compiled::oracle(&ep);
                    let (rec, _) = run_episode(
                        &ep,
                        arm,
                        &mut Scripted::Perfect,
                        &mut OracleMatcher,
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
