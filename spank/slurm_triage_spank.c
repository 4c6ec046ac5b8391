/*
 * slurm_triage_spank.c -- the thin C side of slurm-triage (all logic is in Python).
 *
 * Adds --triage[=on|deep|off] to srun, sbatch and salloc. Without the flag (or with
 * --triage=off) the plugin does nothing at all: no fork, no file, no output.
 * With it:
 *   - sbatch/salloc/srun (init_post_opt): SPANK_TRIAGE=<mode> for the Prolog/Epilog
 *     (spank_job_control_setenv; the only way a SPANK option reaches them);
 *   - srun (local_user_init, as the user): the gang gate,
 *       <python> -I -m slurm_triage.step.spank gate
 *     exit 1 = blocked -> return -1, so nothing launches (a negative return from a
 *     `required` plugin in local_user_init is the one failure that stops a whole step);
 *   - slurmstepd (user_init / exit, as root): watch-start / watch-stop, run as the job's
 *     user (setgroups/setgid/setuid in the child before exec).
 * Helpers get an environment built here (never the job's), cwd "/", no inherited file
 * descriptors, and a hard timeout (the process group is killed).
 *
 * plugstack.conf:
 *   required /abs/slurm_triage_spank.so python=/abs/.venv/bin/python \
 *            [config=/abs/config.toml] [gate_timeout=30] [hook_timeout=10]
 * A bad plugin line is reported only to users who pass --triage, and then fails open.
 *
 * Return values (docs/spank-returns.md). Slurm up to 24.11 fails a callback only on a
 * negative return; since 25.05 (commit 74ff6df484, "Consider all non-zero returns from
 * SPANK functions an error") any non-zero return does, and slurm_spank_init_failure_mode
 * decides whether a failed slurm_spank_init drains the node (ESPANK_NODE_FAILURE, the
 * default) or fails the job (ESPANK_JOB_FAILURE). Every callback here returns 0 or -1, so
 * it means the same on 22.05, 24.11 and >= 25.05, and -1 only where blocking is the point:
 *   option callback, local/allocator: -1 for an invalid --triage value: srun/sbatch/salloc
 *       refuse the command line (exit 1, no job exists, nothing drains);
 *   option callback, remote: 0 (Slurm would only log it; the step runs, not watched);
 *   slurm_spank_init: 0 (a failed option registration is logged; a non-zero init in
 *       slurmstepd of a batch job would drain the node);
 *   slurm_spank_init_post_opt: 0 (a failed setenv is logged);
 *   slurm_spank_local_user_init: -1 only when the gang gate said "blocked": srun exits 1
 *       before any task starts, nothing drains; a gate that fails, times out or cannot
 *       run gives 0 (launch anyway);
 *   slurm_spank_user_init, slurm_spank_exit: 0 (a non-zero user_init in a batch step
 *       drains the node on every release; the watcher is never worth that).
 *
 * Build: make -C spank (gcc -shared -fPIC -I/usr/include/slurm; Slurm 22.05 .. 26.05).
 */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm_errno.h>
#include <slurm/slurm_version.h>
#include <slurm/spank.h>

SPANK_PLUGIN(slurm_triage, 1);

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 5, 0)
/* Read by Slurm >= 25.05 only. Our init never fails; if it ever did, the job is at fault,
 * never the node. */
int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif

#define HELPER_PATH "/usr/sbin:/usr/bin:/sbin:/bin"
#define MAX_GIDS 1024
#define NL_MAX 16384 /* compressed node list; longer ones are left to Slurm lookups */

/* Values 0..2 of the closed set; -1 = flag not given. */
static const char *const modes[] = { "on", "deep", "off" };
static int mode = -1;

static char python[PATH_MAX];
static char config[PATH_MAX];
static int gate_timeout = 30;
static int hook_timeout = 10;
static char arg_error[256]; /* a problem with the plugstack line, reported only with --triage */

static int triage_option(int val, const char *optarg, int remote);

struct spank_option spank_options[] = {
	{ "triage", "[on|deep|off]",
	  "slurm-triage: gate the step on the Prolog's node verdicts and peers, "
	  "and watch it for hangs (deep: more sampling; off: not at all).",
	  2, 0, triage_option },
	SPANK_OPTIONS_TABLE_END
};

static int active(void)
{
	return mode == 0 || mode == 1;
}

/* Printable copy of a user-supplied string for messages. */
static void printable(char *out, size_t len, const char *in)
{
	size_t i;

	for (i = 0; in[i] && i + 1 < len; i++)
		out[i] = (in[i] >= 0x20 && in[i] < 0x7f) ? in[i] : '?';
	out[i] = '\0';
}

/* -1 (refuse the command line) only on the submitting side; remote (slurmstepd) gets the
 * value Slurm forwarded, and an odd one there is logged and leaves the step unwatched. */
static int triage_option(int val, const char *optarg, int remote)
{
	char shown[65];

	(void) val;
	if (optarg == NULL || optarg[0] == '\0') { /* bare --triage */
		mode = 0;
		return 0;
	}
	for (int i = 0; i < 3; i++) {
		if (strcmp(optarg, modes[i]) == 0) {
			mode = i;
			return 0;
		}
	}
	printable(shown, sizeof(shown), optarg);
	slurm_error("slurm-triage: invalid --triage value '%s%s': use --triage, "
		    "--triage=on, --triage=deep or --triage=off%s", shown,
		    strlen(optarg) >= sizeof(shown) ? "..." : "",
		    remote ? "; this step is not watched" : "");
	mode = -1;
	return remote ? 0 : -1;
}

static int abs_path_ok(const char *p)
{
	if (p[0] != '/')
		return 0;
	for (; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return 0;
	return 1;
}

static int parse_seconds(const char *s, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 1 || v > 3600)
		return -1;
	*out = (int) v;
	return 0;
}

static void parse_args(int ac, char **av)
{
	arg_error[0] = python[0] = config[0] = '\0';
	for (int i = 0; i < ac && !arg_error[0]; i++) {
		const char *a = av[i];
		if (!strncmp(a, "python=", 7)) {
			if (!abs_path_ok(a + 7) || strlen(a + 7) >= sizeof(python))
				snprintf(arg_error, sizeof(arg_error), "python= must be an absolute path");
			else
				snprintf(python, sizeof(python), "%s", a + 7);
		} else if (!strncmp(a, "config=", 7)) {
			if (!abs_path_ok(a + 7) || strlen(a + 7) >= sizeof(config))
				snprintf(arg_error, sizeof(arg_error), "config= must be an absolute path");
			else
				snprintf(config, sizeof(config), "%s", a + 7);
		} else if (!strncmp(a, "gate_timeout=", 13)) {
			if (parse_seconds(a + 13, &gate_timeout))
				snprintf(arg_error, sizeof(arg_error), "gate_timeout= must be 1..3600 seconds");
		} else if (!strncmp(a, "hook_timeout=", 13)) {
			if (parse_seconds(a + 13, &hook_timeout))
				snprintf(arg_error, sizeof(arg_error), "hook_timeout= must be 1..3600 seconds");
		} else {
			snprintf(arg_error, sizeof(arg_error), "unknown argument '%.40s'", a);
		}
	}
	if (!arg_error[0] && !python[0])
		snprintf(arg_error, sizeof(arg_error), "python=/abs/path/to/python is required");
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_err_t rc;

	parse_args(ac, av);
	/* sbatch/salloc ignore the static table (22.05): register explicitly. */
	if (spank_context() == S_CTX_ALLOCATOR &&
	    (rc = spank_option_register(sp, &spank_options[0])) != ESPANK_SUCCESS)
		slurm_error("slurm-triage: cannot register --triage: %s", spank_strerror(rc));
	return 0; /* never fail init: on >= 25.05 any non-zero here is an error */
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	spank_err_t rc;

	(void) ac;
	(void) av;
	if (!active() || (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR))
		return 0;
	/* Before the allocation exists: the Prolog/Epilog get SPANK_TRIAGE=<mode>. */
	rc = spank_job_control_setenv(sp, "TRIAGE", modes[mode], 1);
	if (rc != ESPANK_SUCCESS)
		slurm_error("slurm-triage: cannot pass --triage to the Prolog: %s", spank_strerror(rc));
	return 0;
}

/* ---- running a helper ---------------------------------------------------------------- */

struct helper {
	char *argv[5];
	char *envp[16];
	char env_store[16][PATH_MAX + 64];
	char nodelist[NL_MAX + 32];
	int drop;
	uid_t uid;
	gid_t gid;
	gid_t gids[MAX_GIDS];
	int ngids;
};

static struct helper H; /* static: plugins run single-threaded in these callbacks */

static void add_env(int *n, const char *fmt, const char *val)
{
	if (*n >= 14)
		return;
	snprintf(H.env_store[*n], sizeof(H.env_store[*n]), fmt, val);
	H.envp[*n] = H.env_store[*n];
	(*n)++;
}

static const char *step_name(uint32_t step, char *buf, size_t len)
{
	if (step == 0xfffffffb)
		return "batch";
	if (step == 0xfffffffc)
		return "extern";
	if (step == 0xfffffffa)
		return "interactive";
	snprintf(buf, len, "%u", step);
	return buf;
}

/* Fill H for a helper; everything is formatted before fork (the child only calls
 * async-signal-safe functions: slurmstepd is multi-threaded). */
static int prepare(spank_t sp, int drop)
{
	uint32_t job = 0, step = 0;
	char num[32], stepbuf[16], node[256] = "", *nl;
	const char *conf = getenv("SLURM_CONF");
	int n = 0;

	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
		return -1;
	memset(&H, 0, sizeof(H));
	H.drop = drop;
	if (drop) {
		gid_t *gids = NULL;
		int ngids = 0;
		if (spank_get_item(sp, S_JOB_UID, &H.uid) != ESPANK_SUCCESS ||
		    spank_get_item(sp, S_JOB_GID, &H.gid) != ESPANK_SUCCESS)
			return -1;
		if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) == ESPANK_SUCCESS &&
		    gids && ngids > 0) {
			H.ngids = ngids > MAX_GIDS ? MAX_GIDS : ngids;
			memcpy(H.gids, gids, H.ngids * sizeof(gid_t));
		} else {
			H.gids[0] = H.gid;
			H.ngids = 1;
		}
		if (getenv("SLURMD_NODENAME"))	/* slurmstepd's own env: reliable */
			snprintf(node, sizeof(node), "%s", getenv("SLURMD_NODENAME"));
		if (spank_getenv(sp, "SLURM_STEP_NODELIST", H.nodelist, NL_MAX) != ESPANK_SUCCESS &&
		    spank_getenv(sp, "SLURM_JOB_NODELIST", H.nodelist, NL_MAX) != ESPANK_SUCCESS)
			H.nodelist[0] = '\0';
	} else {
		H.uid = getuid();
		H.gid = getgid();
		nl = getenv("SLURM_STEP_NODELIST");
		if (!nl)
			nl = getenv("SLURM_JOB_NODELIST");
		if (nl && strlen(nl) < NL_MAX)
			snprintf(H.nodelist, NL_MAX, "%s", nl);
	}
	H.argv[0] = python;
	H.argv[1] = "-I";
	H.argv[2] = "-m";
	H.argv[3] = "slurm_triage.step.spank";
	H.argv[4] = NULL; /* child() appends the action */
	add_env(&n, "PATH=%s", HELPER_PATH);
	add_env(&n, "LANG=%s", "C");
	if (conf && abs_path_ok(conf))
		add_env(&n, "SLURM_CONF=%s", conf);
	if (config[0])
		add_env(&n, "SLURM_TRIAGE_CONFIG=%s", config);
	snprintf(num, sizeof(num), "%u", job);
	add_env(&n, "SLURM_TRIAGE_JOB_ID=%s", num);
	add_env(&n, "SLURM_TRIAGE_STEP_ID=%s", step_name(step, stepbuf, sizeof(stepbuf)));
	add_env(&n, "SLURM_TRIAGE_NODE=%s", node);
	snprintf(num, sizeof(num), "%u", (unsigned) H.uid);
	add_env(&n, "SLURM_TRIAGE_UID=%s", num);
	snprintf(num, sizeof(num), "%u", (unsigned) H.gid);
	add_env(&n, "SLURM_TRIAGE_GID=%s", num);
	add_env(&n, "SLURM_TRIAGE_MODE=%s", modes[mode]);
	H.envp[n] = NULL;
	/* the node list can be long: its own buffer */
	memmove(H.nodelist + 22, H.nodelist, strlen(H.nodelist) + 1);
	memcpy(H.nodelist, "SLURM_TRIAGE_NODELIST=", 22);
	H.envp[n++] = H.nodelist;
	H.envp[n] = NULL;
	return 0;
}

static void child(const char *action, int out_fd)
{
	char *argv[6];
	struct rlimit rl;
	sigset_t all;
	int devnull, maxfd;

	setpgid(0, 0);
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	for (int s = 1; s < NSIG; s++)
		signal(s, SIG_DFL);
	devnull = open("/dev/null", O_RDWR);
	if (devnull < 0)
		_exit(126);
	dup2(devnull, 0);
	if (out_fd >= 0) {
		dup2(out_fd, 1);
		dup2(out_fd, 2);
	}
	maxfd = (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536) ? (int) rl.rlim_cur : 65536;
	for (int fd = 3; fd < maxfd; fd++)
		close(fd);
	if (H.drop) {
		/* user_init runs with euid = the user and ruid = 0: regain root first,
		 * then drop all of real/effective/saved ids for good. */
		if (geteuid() != 0 && seteuid(0) < 0 && getuid() == 0)
			_exit(126);
		if (geteuid() == 0 &&
		    (setgroups(H.ngids, H.gids) < 0 || setgid(H.gid) < 0 || setuid(H.uid) < 0))
			_exit(126);
		if (getuid() != H.uid || geteuid() != H.uid || getgid() != H.gid || getegid() != H.gid)
			_exit(126);
		if (H.uid != 0 && (setuid(0) == 0 || seteuid(0) == 0))
			_exit(126);
	}
	if (chdir("/") < 0)
		_exit(126);
	memcpy(argv, H.argv, 4 * sizeof(char *));
	argv[4] = (char *) action;
	argv[5] = NULL;
	execve(python, argv, H.envp);
	_exit(127);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Relay what a remote helper printed to slurmd's log, line by line. */
static void relay(const char *action, char *buf, int failed)
{
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (failed)
			slurm_error("slurm-triage %s: %s", action, line);
		else
			slurm_info("slurm-triage %s: %s", action, line);
	}
}

/* fork/exec/wait with a timeout. Returns the exit code, -2 on timeout, -1 when it
 * could not run. capture: the child's stdout/stderr go to slurmd's log (remote). */
static int run_helper(spank_t sp, const char *action, int drop, int timeout, int capture)
{
	char out[4096];
	size_t used = 0;
	int pfd[2] = { -1, -1 }, status = 0, rc = -1;
	double deadline;
	pid_t pid, w;

	if (prepare(sp, drop) < 0) {
		slurm_error("slurm-triage: %s: job/step ids unavailable; skipped", action);
		return -1;
	}
	if (capture && pipe2(pfd, O_CLOEXEC) < 0)
		pfd[0] = pfd[1] = -1;
	pid = fork();
	if (pid < 0) {
		slurm_error("slurm-triage: %s: fork: %s", action, strerror(errno));
		if (pfd[0] >= 0) { close(pfd[0]); close(pfd[1]); }
		return -1;
	}
	if (pid == 0)
		child(action, pfd[1]);
	if (pfd[1] >= 0) {
		close(pfd[1]);
		fcntl(pfd[0], F_SETFL, O_NONBLOCK);
	}
	deadline = now() + timeout;
	for (;;) {
		w = waitpid(pid, &status, WNOHANG);
		if (w == pid || (w < 0 && errno != EINTR))
			break;
		if (now() > deadline) {
			kill(-pid, SIGKILL);
			kill(pid, SIGKILL);
			while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
				;
			rc = -2;
			break;
		}
		if (pfd[0] >= 0) {
			struct pollfd p = { .fd = pfd[0], .events = POLLIN };
			if (poll(&p, 1, 20) > 0) {
				ssize_t r = read(pfd[0], out + used, sizeof(out) - 1 - used);
				if (r > 0)
					used += r;
				else if (r == 0) { /* EOF: the helper closed its output */
					close(pfd[0]);
					pfd[0] = -1;
				}
				if (used >= sizeof(out) - 1)
					used = sizeof(out) - 1;
			}
		} else {
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
		}
	}
	if (pfd[0] >= 0) { /* what is left, without waiting for a daemonized grandchild */
		ssize_t r;
		while (used < sizeof(out) - 1 && (r = read(pfd[0], out + used, sizeof(out) - 1 - used)) > 0)
			used += r;
		close(pfd[0]);
	}
	if (rc != -2)
		rc = (w == pid && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
	out[used] = '\0';
	if (capture)
		relay(action, out, rc != 0);
	if (rc == -2)
		slurm_error("slurm-triage: %s: no answer within %d s; killed", action, timeout);
	else if (rc == 126)
		slurm_error("slurm-triage: %s: could not become uid %u/gid %u; not run", action,
			    (unsigned) H.uid, (unsigned) H.gid);
	else if (rc == 127)
		slurm_error("slurm-triage: %s: could not execute %s as uid %u", action, python,
			    (unsigned) H.uid);
	return rc;
}

/* ---- srun: the gang gate ----------------------------------------------------------- */

int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	int rc;

	(void) ac;
	(void) av;
	if (!active())
		return 0;
	if (arg_error[0]) {
		slurm_error("slurm-triage: plugin misconfigured (%s); gang gate skipped", arg_error);
		return 0;
	}
	rc = run_helper(sp, "gate", 0, gate_timeout, 0);
	if (rc == 1) {
		slurm_error("slurm-triage: the gang gate blocked this step; nothing was launched");
		return -1;
	}
	if (rc != 0)
		slurm_error("slurm-triage: gang gate did not decide; launching anyway");
	return 0;
}

/* ---- slurmstepd: the watcher, as the job's user ------------------------------------ */

static int remote_hook(spank_t sp, const char *action)
{
	uint32_t step = 0;

	if (!active() || !spank_remote(sp))
		return 0;
	if (arg_error[0]) {
		slurm_error("slurm-triage: plugin misconfigured (%s); %s skipped", arg_error, action);
		return 0;
	}
	if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS && step == 0xfffffffc)
		return 0; /* the extern step runs no user code */
	run_helper(sp, action, 1, hook_timeout, 1);
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return remote_hook(sp, "watch-start");
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return remote_hook(sp, "watch-stop");
}
