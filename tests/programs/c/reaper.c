/* reaper: a parent that reaps its own children through every wait function, as torchrun's agent or a shell
 * does, for the test of the shim's reports of reaped children (tests/e2e/tests/reaped.rs).
 *
 * It checks what it sees itself (return values, statuses, errno left as it was on success, ECHILD at the end),
 * and prints one line per child it reaped: "reaped <pid> exit <code>" or "reaped <pid> signal <sig>", plus a
 * "peeked"/"stopped"/"none" line for the waits that reap nothing, then "PASS". On any surprise: "FAIL <what>",
 * exit 1.
 *
 *   reaper          the parent never touches CUDA: its shim reports on one-shot connections
 *   reaper cuda     the parent makes a tracked call first (its shim is connected, reports go in its ring), and
 *                   one child forks and reaps a grandchild of its own (a forked child reports on its own)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define SENTINEL 4242

static void fail(const char *what) {
    printf("FAIL %s (errno %d)\n", what, errno);
    fflush(stdout);
    exit(1);
}

static pid_t child_exiting(int code) {
    fflush(stdout);
    pid_t p = fork();
    if (p < 0) fail("fork");
    if (p == 0) _exit(code);
    return p;
}

static pid_t child_waiting(void) {
    fflush(stdout);
    pid_t p = fork();
    if (p < 0) fail("fork");
    if (p == 0) {
        for (;;) pause();
    }
    return p;
}

/* Set by the SIGCHLD handler. */
static volatile sig_atomic_t handler_pid = 0, handler_status = -1, handler_errno_kept = 1;

static void on_sigchld(int sig) {
    (void)sig;
    int saved = errno;
    int st;
    pid_t p;
    errno = SENTINEL;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (errno != SENTINEL) handler_errno_kept = 0;
        handler_pid = p;
        handler_status = st;
    }
    errno = saved;
}

/* cuda: a tracked call through the simulated driver, so that the shim connects and makes its ring. */
static void touch_cuda(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) fail("dlopen libcuda.so.1");
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*info)(size_t *, size_t *) = (int (*)(size_t *, size_t *))dlsym(h, "cuMemGetInfo_v2");
    if (!init || !info) fail("dlsym");
    init(0);
    size_t f = 0, t = 0;
    info(&f, &t); /* no context: an error, but a tracked call all the same */
}

int main(int argc, char **argv) {
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    int st;
    pid_t r;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuda) touch_cuda();

    /* 1. exit(3), reaped with waitpid. */
    pid_t a = child_exiting(3);
    errno = SENTINEL;
    r = waitpid(a, &st, 0);
    if (r != a || !WIFEXITED(st) || WEXITSTATUS(st) != 3) fail("waitpid of exit(3)");
    if (errno != SENTINEL) fail("waitpid changed errno");
    printf("reaped %d exit 3\n", a);

    /* 2. SIGKILLed, reaped with wait4 and a NULL status. */
    pid_t b = child_waiting();
    if (kill(b, SIGKILL) != 0) fail("kill");
    struct rusage ru;
    errno = SENTINEL;
    r = wait4(b, NULL, 0, &ru);
    if (r != b) fail("wait4 of a SIGKILLed child");
    if (errno != SENTINEL) fail("wait4 changed errno");
    printf("reaped %d signal 9\n", b);

    /* 3. exit(0): peeked at with WNOWAIT (not reaped), then reaped with waitid. */
    pid_t c = child_exiting(0);
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, c, &si, WEXITED | WNOWAIT) != 0 || si.si_pid != c) fail("waitid WNOWAIT");
    printf("peeked %d\n", c);
    memset(&si, 0, sizeof si);
    errno = SENTINEL;
    if (waitid(P_PID, c, &si, WEXITED) != 0) fail("waitid");
    if (si.si_pid != c || si.si_code != CLD_EXITED || si.si_status != 0) fail("waitid's info");
    if (errno != SENTINEL) fail("waitid changed errno");
    printf("reaped %d exit 0\n", c);

    /* 4. Stopped (WUNTRACED: not a reap), polled (WNOHANG: nothing), then SIGTERMed and reaped with wait. */
    pid_t d = child_waiting();
    if (kill(d, SIGSTOP) != 0) fail("kill SIGSTOP");
    r = waitpid(d, &st, WUNTRACED);
    if (r != d || !WIFSTOPPED(st)) fail("waitpid of a stopped child");
    printf("stopped %d\n", d);
    if (kill(d, SIGCONT) != 0) fail("kill SIGCONT");
    r = waitpid(d, &st, WCONTINUED);
    if (r != d || !WIFCONTINUED(st)) fail("waitpid of a continued child");
    r = waitpid(d, &st, WNOHANG);
    if (r != 0) fail("waitpid WNOHANG of a running child");
    printf("none %d\n", d);
    if (kill(d, SIGTERM) != 0) fail("kill SIGTERM");
    errno = SENTINEL;
    r = wait(&st);
    if (r != d || !WIFSIGNALED(st) || WTERMSIG(st) != SIGTERM) fail("wait of a SIGTERMed child");
    if (errno != SENTINEL) fail("wait changed errno");
    printf("reaped %d signal 15\n", d);

    /* 5. cuda: a forked child of the connected parent reaps a grandchild (exit(4)) itself, then exits 6. */
    if (cuda) {
        fflush(stdout);
        pid_t g = fork();
        if (g < 0) fail("fork");
        if (g == 0) {
            pid_t h = fork();
            if (h < 0) _exit(20);
            if (h == 0) _exit(4);
            int s;
            errno = SENTINEL;
            if (waitpid(h, &s, 0) != h || !WIFEXITED(s) || WEXITSTATUS(s) != 4) _exit(21);
            if (errno != SENTINEL) _exit(22);
            printf("grandchild %d of %d exit 4\n", h, getpid());
            fflush(stdout);
            _exit(6);
        }
        r = waitpid(g, &st, 0);
        if (r != g || !WIFEXITED(st) || WEXITSTATUS(st) != 6) fail("the child that reaps its own");
        printf("reaped %d exit 6\n", g);
    }

    /* 6. exit(7), reaped in a SIGCHLD handler (waitpid with WNOHANG, in a loop). */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &old);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigchld;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGCHLD, &sa, NULL) != 0) fail("sigaction");
    pid_t e = child_exiting(7);
    while (handler_pid == 0) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (handler_pid != e || !WIFEXITED(handler_status) || WEXITSTATUS(handler_status) != 7)
        fail("the handler's reap");
    if (!handler_errno_kept) fail("waitpid in the handler changed errno");
    printf("reaped %d exit 7\n", e);
    signal(SIGCHLD, SIG_DFL);

    /* 6b. exit(5), reaped with wait3 (Python's os.wait3). */
    pid_t w3 = child_exiting(5);
    errno = SENTINEL;
    r = wait3(&st, 0, &ru);
    if (r != w3 || !WIFEXITED(st) || WEXITSTATUS(st) != 5) fail("wait3 of exit(5)");
    if (errno != SENTINEL) fail("wait3 changed errno");
    printf("reaped %d exit 5\n", w3);

    /* 7. No children left: ECHILD, as without the shim. */
    errno = 0;
    r = waitpid(-1, &st, 0);
    if (r != -1 || errno != ECHILD) fail("waitpid with no children");
    printf("echild %d\n", errno);
    printf("PASS\n");
    return 0;
}
