use super::*;

#[test]
fn the_kinds_said_to_carry_a_process_time_are_those_whose_records_do() {
    let recs = [
        Record::Note {
            pid: 1,
            ts_ns: 5,
            text: "n".into(),
        },
        Record::ContextGone {
            pid: 1,
            ts_ns: 5,
            device: 0,
            how: "h".into(),
        },
        Record::Reaped {
            pid: 1,
            ts_ns: 5,
            child: 2,
            status: ExitStatus::Code(3),
        },
        Record::Goodbye { pid: 1, ts_ns: 5 },
        Record::Tick { pid: 1, ts_ns: 5 },
        Record::Dropped {
            pid: 1,
            ts_ns: 5,
            count: 1,
        },
    ];
    for mut r in recs {
        let mut buf = Vec::new();
        codec::put_record(&mut buf, &r);
        let (k, _) = codec::frames(&buf).next().unwrap();
        assert_eq!(
            Record::has_process_time(k),
            r.process_time_mut().is_some(),
            "kind {k}"
        );
    }
}

#[test]
fn wait_statuses_read_as_the_shell_reads_them() {
    // As <sys/wait.h> packs them: code << 8; the signal; 0x80 for a core dump; 0x7f stopped.
    assert_eq!(ExitStatus::from_wait(7 << 8), Some(ExitStatus::Code(7)));
    assert_eq!(ExitStatus::from_wait(0), Some(ExitStatus::Code(0)));
    let kill = ExitStatus::from_wait(9).unwrap();
    assert_eq!(
        kill,
        ExitStatus::Signal {
            signal: 9,
            core: false
        }
    );
    assert_eq!(kill.shell_code(), 137);
    assert_eq!(kill.describe(), "killed by SIGKILL (signal 9)");
    assert_eq!(
        ExitStatus::from_wait(0x80 | 11),
        Some(ExitStatus::Signal {
            signal: 11,
            core: true
        })
    );
    assert_eq!(ExitStatus::from_wait((19 << 8) | 0x7f), None);
    assert_eq!(signal_name(64), "SIG64");
}

#[test]
fn waitid_child_info_reads_as_the_wait_status_would() {
    // si_code CLD_EXITED / CLD_KILLED / CLD_DUMPED, and what trapped (4), stopped (5) or continued (6) says.
    assert_eq!(
        ExitStatus::from_child_info(1, 3),
        ExitStatus::from_wait(3 << 8)
    );
    assert_eq!(ExitStatus::from_child_info(2, 9), ExitStatus::from_wait(9));
    assert_eq!(
        ExitStatus::from_child_info(3, 11),
        ExitStatus::from_wait(0x80 | 11)
    );
    for code in [4, 5, 6, 0] {
        assert_eq!(
            ExitStatus::from_child_info(code, 19),
            None,
            "si_code {code}"
        );
    }
}
