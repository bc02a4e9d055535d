/*
 * sunk's container jobs: a SPANK plugin with pyxis' options.
 *
 *   srun --container-image=[REGISTRY#]IMAGE[:TAG] [--container-mounts=SRC[:DST[:ro]],...]
 *        [--container-workdir=PATH] [--container-name=NAME]
 *        [--[no-]container-mount-home] [--container-writable|--container-readonly] cmd
 *
 * and the same options on sbatch (the batch script runs in the image) and salloc.
 * Why a plugin of our own and how it works: docs/containers.md. In short, per step
 * and node, in slurmstepd (root):
 *
 *   init_post_opt        the fetcher (container-fetch, skopeo + umoci) puts the image,
 *                        by digest, in the node's cache; the step's root is an overlay
 *                        of it (or a read-only bind) under <cache>/steps or, for a named
 *                        container, <cache>/jobs/<job>/<name>.
 *   task_init_privileged in each task, before Slurm drops to the user and looks up
 *                        the command: a mount namespace of its own, the node's /proc,
 *                        /sys, /dev, /tmp, Slurm's spool, /etc/hosts and friends, the
 *                        user's passwd entry and the user's --container-mounts cloned
 *                        (open_tree) from the node, pivot_root into the step's root, the
 *                        clones attached inside (move_mount: paths resolve inside the
 *                        image, never on the node), no_new_privs, the image's ENV.
 *   exit                 the step's root unmounted and, unless named, removed.
 *
 * The task stays Slurm's own process: the same cgroup, uid, signals, stdio and
 * accounting as any step; only its view of the filesystem changes. Every mount is
 * nosuid (and no_new_privs is set), so nothing in an image can raise privileges.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pwd.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(containers, 1);

#define LOG_PREFIX "containers: "
#define MAX_MOUNTS 64

struct user_mount {
	char src[PATH_MAX];
	char dst[PATH_MAX];
	int readonly;
};

/* What the user asked for (the options). */
static struct {
	char *image;
	char *workdir;
	char *name;
	struct user_mount mounts[MAX_MOUNTS];
	size_t mounts_len;
	int mount_home; /* -1: plugstack.conf's default */
	int writable;   /* -1: writable */
	int remap_root;
} args = {.mount_home = -1, .writable = -1, .remap_root = -1};

/* plugstack.conf arguments. */
#define CONFIG_PATH_MAX 1024
static struct {
	char cache[CONFIG_PATH_MAX];
	char fetcher[CONFIG_PATH_MAX];
	char spool[CONFIG_PATH_MAX];
	int mount_home;
} config;

/* The step on this node (remote context only). */
static struct {
	int enabled;
	int named;
	int mounted;
	uint32_t jobid, stepid;
	uid_t uid;
	gid_t gid;
	char image_dir[PATH_MAX]; /* <cache>/images/<digest> */
	char step_dir[PATH_MAX];
	char root[PATH_MAX + 8];
	char error[2048]; /* reported by the tasks, so srun shows it */
} step;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(step.error, sizeof(step.error), fmt, ap);
	va_end(ap);
	return -1;
}

/* ------------------------------------------------------------------ options */

static int opt_image(int val, const char *optarg, int remote)
{
	if (!optarg || !*optarg) {
		slurm_error(LOG_PREFIX "--container-image needs an image");
		return -1;
	}
	/* Slurm may call us twice with the same value (sbatch's, then the step's). */
	if (args.image && strcmp(args.image, optarg) != 0) {
		slurm_error(LOG_PREFIX "--container-image given twice");
		return -1;
	}
	free(args.image);
	args.image = strdup(optarg);
	return 0;
}

static int opt_mounts(int val, const char *optarg, int remote)
{
	char *copy, *rest, *entry;

	if (!optarg || !*optarg) {
		slurm_error(LOG_PREFIX "--container-mounts needs SRC[:DST[:FLAGS]][,...]");
		return -1;
	}
	args.mounts_len = 0; /* a repeated option replaces the list, as for the others */
	copy = strdup(optarg);
	rest = copy;
	while ((entry = strsep(&rest, ",")) != NULL) {
		struct user_mount *m;
		char *src, *dst, *flags, *flag;

		if (!*entry)
			continue;
		if (args.mounts_len == MAX_MOUNTS) {
			slurm_error(LOG_PREFIX "more than %d --container-mounts", MAX_MOUNTS);
			goto bad;
		}
		m = &args.mounts[args.mounts_len];
		src = strsep(&entry, ":");
		dst = entry ? strsep(&entry, ":") : NULL;
		flags = entry;
		if (!dst || !*dst)
			dst = src;
		if (*dst != '/') {
			slurm_error(LOG_PREFIX "--container-mounts: %s: the target must be an absolute path", dst);
			goto bad;
		}
		if (snprintf(m->src, sizeof(m->src), "%s", src) >= (int)sizeof(m->src) ||
		    snprintf(m->dst, sizeof(m->dst), "%s", dst) >= (int)sizeof(m->dst))
			goto bad;
		m->readonly = 0;
		/* pyxis separates flags with '+' (',' separates mounts). */
		while (flags && (flag = strsep(&flags, "+")) != NULL) {
			if (strcmp(flag, "ro") == 0)
				m->readonly = 1;
			else if (strcmp(flag, "rw") == 0)
				m->readonly = 0;
			else if (strcmp(flag, "rbind") && strcmp(flag, "bind") && strcmp(flag, "rprivate") &&
				 strcmp(flag, "private") && strcmp(flag, "rslave") && strcmp(flag, "slave") &&
				 *flag) {
				slurm_error(LOG_PREFIX "--container-mounts: unknown flag %s (ro, rw)", flag);
				goto bad;
			}
		}
		args.mounts_len++;
	}
	free(copy);
	return 0;
bad:
	free(copy);
	return -1;
}

static int opt_workdir(int val, const char *optarg, int remote)
{
	if (!optarg || *optarg != '/') {
		slurm_error(LOG_PREFIX "--container-workdir needs an absolute path");
		return -1;
	}
	free(args.workdir);
	args.workdir = strdup(optarg);
	return 0;
}

static int opt_name(int val, const char *optarg, int remote)
{
	const char *c;

	if (!optarg || !*optarg || *optarg == '.') {
		slurm_error(LOG_PREFIX "--container-name needs a name");
		return -1;
	}
	for (c = optarg; *c; c++) {
		if (!isalnum((unsigned char)*c) && !strchr("._-", *c)) {
			slurm_error(LOG_PREFIX "--container-name: letters, digits, '.', '_' and '-' only");
			return -1;
		}
	}
	free(args.name);
	args.name = strdup(optarg);
	return 0;
}

static int opt_mount_home(int val, const char *optarg, int remote)
{
	args.mount_home = val;
	return 0;
}

static int opt_writable(int val, const char *optarg, int remote)
{
	args.writable = val;
	return 0;
}

static int opt_remap_root(int val, const char *optarg, int remote)
{
	args.remap_root = val;
	return 0;
}

static struct spank_option options[] = {
	{"container-image", "[REGISTRY#]IMAGE[:TAG]",
	 "[containers] run the step in this image, from the cluster's registries "
	 "(REGISTRY/IMAGE:TAG works too)",
	 1, 0, opt_image},
	{"container-mounts", "SRC[:DST[:FLAGS]][,...]",
	 "[containers] bind mounts of this node's paths into the container; FLAGS: ro or rw, "
	 "joined with '+'",
	 1, 0, opt_mounts},
	{"container-workdir", "PATH", "[containers] working directory inside the container", 1, 0,
	 opt_workdir},
	{"container-name", "NAME",
	 "[containers] keep the container's filesystem under this name for the job's later steps "
	 "on the same node (which may then omit --container-image)",
	 1, 0, opt_name},
	{"container-mount-home", NULL, "[containers] bind mount your home directory", 0, 1,
	 opt_mount_home},
	{"no-container-mount-home", NULL, "[containers] do not bind mount your home directory", 0, 0,
	 opt_mount_home},
	{"container-writable", NULL,
	 "[containers] the container's filesystem is writable, per step (default)", 0, 1, opt_writable},
	{"container-readonly", NULL, "[containers] the container's filesystem is read-only", 0, 0,
	 opt_writable},
	{"container-remap-root", NULL, "[containers] not supported: steps run as you", 0, 1,
	 opt_remap_root},
	{"no-container-remap-root", NULL, "[containers] run as yourself inside the container (always)",
	 0, 0, opt_remap_root},
	SPANK_OPTIONS_TABLE_END};

static int parse_bool(const char *s)
{
	if (!strcmp(s, "1") || !strcmp(s, "yes") || !strcmp(s, "y") || !strcmp(s, "true"))
		return 1;
	if (!strcmp(s, "0") || !strcmp(s, "no") || !strcmp(s, "n") || !strcmp(s, "false"))
		return 0;
	return -1;
}

static int parse_config(int ac, char **av)
{
	snprintf(config.cache, sizeof(config.cache), "/var/lib/sunk-containers");
	snprintf(config.fetcher, sizeof(config.fetcher), "/usr/lib/sunk/container-fetch");
	snprintf(config.spool, sizeof(config.spool), "/var/spool/slurmd");
	config.mount_home = 0; /* enroot's default: ENROOT_MOUNT_HOME=no */
	for (int i = 0; i < ac; i++) {
		const char *v = strchr(av[i], '=');
		char *target = NULL;

		if (!v) {
			slurm_error(LOG_PREFIX "plugstack.conf: %s is not KEY=VALUE", av[i]);
			return -1;
		}
		v++;
		if (!strncmp(av[i], "cache=", 6))
			target = config.cache;
		else if (!strncmp(av[i], "fetcher=", 8))
			target = config.fetcher;
		else if (!strncmp(av[i], "spool=", 6))
			target = config.spool;
		else if (!strncmp(av[i], "mount_home=", 11)) {
			if ((config.mount_home = parse_bool(v)) < 0) {
				slurm_error(LOG_PREFIX "plugstack.conf: mount_home=%s is not yes/no", v);
				return -1;
			}
			continue;
		} else {
			slurm_error(LOG_PREFIX "plugstack.conf: unknown argument %s", av[i]);
			return -1;
		}
		if (*v != '/' || snprintf(target, CONFIG_PATH_MAX, "%s", v) >= CONFIG_PATH_MAX) {
			slurm_error(LOG_PREFIX "plugstack.conf: %s needs an absolute path", av[i]);
			return -1;
		}
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR &&
	    ctx != S_CTX_JOB_SCRIPT)
		return 0;
	if (parse_config(ac, av) < 0)
		return -1;
	if (ctx == S_CTX_JOB_SCRIPT)
		return 0;
	for (int i = 0; options[i].name; i++) {
		if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
			slurm_error(LOG_PREFIX "cannot register --%s", options[i].name);
			return -1;
		}
	}
	return 0;
}

/* ------------------------------------------------------------------ the step */

/* Run argv as root; its output (stdout and stderr) in out. Exit status, or -1. */
static int run(char *const argv[], char *out, size_t out_len)
{
	int pipefd[2], status;
	size_t used = 0;
	ssize_t n;
	pid_t pid;

	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		dup2(null, 0);
		dup2(pipefd[1], 1);
		dup2(pipefd[1], 2);
		execve(argv[0], argv,
		       (char *[]){"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				  "HOME=/root", NULL});
		fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	while (used + 1 < out_len && (n = read(pipefd[0], out + used, out_len - used - 1)) > 0)
		used += n;
	out[used] = '\0';
	/* Drain what did not fit so that the child never blocks on a full pipe. */
	while (read(pipefd[0], (char[256]){0}, 256) > 0)
		;
	close(pipefd[0]);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return -1;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		return rmdir(path);
	return unlink(path);
}

static void remove_tree(const char *path)
{
	nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* The image in the node's cache (fetched if missing): step.image_dir. */
static int fetch_image(const char *image)
{
	char out[4096], *last, *end;
	int rc;

	rc = run((char *[]){config.fetcher, config.cache, (char *)image, NULL}, out, sizeof(out));
	end = out + strlen(out);
	while (end > out && end[-1] == '\n')
		*--end = '\0';
	if (rc != 0)
		return fail("cannot fetch %s: %s", image, out);
	last = strrchr(out, '\n');
	last = last ? last + 1 : out;
	if (*last != '/' || snprintf(step.image_dir, sizeof(step.image_dir), "%s", last) >=
				    (int)sizeof(step.image_dir))
		return fail("the fetcher printed no image directory: %s", out);
	return 0;
}

static int read_line_file(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "re");
	int ok;

	if (!f)
		return -1;
	ok = fgets(buf, len, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

static int write_file(const char *path, const char *content)
{
	FILE *f = fopen(path, "we");

	if (!f)
		return -1;
	fputs(content, f);
	return fclose(f);
}

/* The file rel inside root, symlinks resolved inside root (never on the node). */
static FILE *open_in_root(const char *root, const char *rel)
{
	struct open_how how = {.flags = O_RDONLY | O_CLOEXEC,
			       .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
	int dirfd, fd;

	dirfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return NULL;
	fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
	close(dirfd);
	return fd < 0 ? NULL : fdopen(fd, "r");
}

/*
 * /etc/passwd and /etc/group for the container: the image's, plus the user's
 * entry and primary group from this node when the image lacks them (as enroot
 * does), so that `id`, `whoami` and ssh inside the container know the user.
 */
static int write_identity(void)
{
	struct passwd *pw = getpwuid(step.uid);
	struct group *gr = getgrgid(step.gid);
	char path[PATH_MAX + 16], line[4096], entry[64];
	const char *files[] = {"passwd", "group"};

	for (int i = 0; i < 2; i++) {
		FILE *in = NULL, *out;
		int found = 0;
		unsigned long id = i == 0 ? step.uid : step.gid;

		snprintf(path, sizeof(path), "%s/%s", step.step_dir, files[i]);
		out = fopen(path, "we");
		if (!out)
			return fail("cannot write %s: %s", path, strerror(errno));
		snprintf(entry, sizeof(entry), "etc/%s", files[i]);
		in = open_in_root(step.root, entry);
		while (in && fgets(line, sizeof(line), in)) {
			char *field = line;
			unsigned long lid;

			fputs(line, out);
			if (line[0] && line[strlen(line) - 1] != '\n')
				fputc('\n', out);
			/* name:x:ID:... */
			for (int f = 0; f < 2 && field; f++)
				field = strchr(field, ':') ? strchr(field, ':') + 1 : NULL;
			if (field && sscanf(field, "%lu", &lid) == 1 && lid == id)
				found = 1;
		}
		if (in)
			fclose(in);
		if (!found && i == 0 && pw)
			fprintf(out, "%s:x:%u:%u:%s:%s:%s\n", pw->pw_name, pw->pw_uid, pw->pw_gid,
				pw->pw_gecos ? pw->pw_gecos : "", pw->pw_dir, pw->pw_shell);
		if (!found && i == 1 && gr)
			fprintf(out, "%s:x:%u:\n", gr->gr_name, gr->gr_gid);
		if (fclose(out) != 0)
			return fail("cannot write %s", path);
	}
	return 0;
}

static int mount_root(void)
{
	char lower[PATH_MAX + 16], opts[3 * PATH_MAX + 64];

	snprintf(lower, sizeof(lower), "%s/rootfs", step.image_dir);
	if (args.writable == 0) {
		if (mount(lower, step.root, NULL, MS_BIND | MS_REC, NULL) < 0 ||
		    mount(NULL, step.root, NULL,
			  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
			return fail("cannot mount the image read-only: %s", strerror(errno));
	} else {
		char upper[PATH_MAX + 8], work[PATH_MAX + 8];

		snprintf(upper, sizeof(upper), "%s/upper", step.step_dir);
		snprintf(work, sizeof(work), "%s/work", step.step_dir);
		if (mkdir_p(upper, 0755) < 0 || mkdir_p(work, 0700) < 0)
			return fail("cannot make %s: %s", upper, strerror(errno));
		snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work);
		if (mount("overlay", step.root, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
			return fail("cannot mount the container's overlay: %s", strerror(errno));
	}
	step.mounted = 1;
	return 0;
}

static int prepare_step(spank_t sp)
{
	char image_file[PATH_MAX + 8];

	if (spank_get_item(sp, S_JOB_UID, &step.uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &step.gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &step.jobid) != ESPANK_SUCCESS)
		return fail("cannot read the job's uid, gid or id");
	if (args.remap_root == 1)
		return fail("--container-remap-root is not supported: steps run as their user");
	step.named = args.name != NULL;
	if (step.named)
		snprintf(step.step_dir, sizeof(step.step_dir), "%s/jobs/%u/%s", config.cache,
			 step.jobid, args.name);
	else
		snprintf(step.step_dir, sizeof(step.step_dir), "%s/steps/%u.%u", config.cache,
			 step.jobid, step.stepid);
	snprintf(step.root, sizeof(step.root), "%s/root", step.step_dir);
	snprintf(image_file, sizeof(image_file), "%s/image", step.step_dir);

	if (step.named && read_line_file(image_file, step.image_dir, sizeof(step.image_dir)) == 0) {
		/* An earlier step of this job made it: reuse it, as pyxis does. */
		slurm_verbose(LOG_PREFIX "reusing container %s", args.name);
	} else if (!args.image) {
		return fail("no container named %s in this job on this node, and no --container-image",
			    args.name);
	} else {
		if (fetch_image(args.image) < 0)
			return -1;
		if (mkdir_p(step.root, 0755) < 0)
			return fail("cannot make %s: %s", step.root, strerror(errno));
		if (write_file(image_file, step.image_dir) < 0)
			return fail("cannot write %s", image_file);
	}
	if (mkdir_p(step.root, 0755) < 0)
		return fail("cannot make %s: %s", step.root, strerror(errno));
	if (mount_root() < 0)
		return -1;
	return write_identity();
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	if (!args.image && !args.name) {
		if (args.mounts_len || args.workdir || args.mount_home != -1 || args.writable != -1) {
			slurm_error(LOG_PREFIX "--container-* options need --container-image or --container-name");
			return -1;
		}
		return 0;
	}
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step.stepid) != ESPANK_SUCCESS)
		return 0;
	/* The extern step (pam_slurm_adopt's ssh sessions) stays on the node. */
	if (step.stepid == SLURM_EXTERN_CONT)
		return 0;
	step.enabled = 1;
	/*
	 * An error here would reach srun only as "spank plugin failed"; the tasks
	 * report it instead (pyxis does the same, for the same reason).
	 */
	if (prepare_step(sp) < 0)
		slurm_error(LOG_PREFIX "%s", step.error);
	return 0;
}

/* ------------------------------------------------------------------ the task */

struct tree {
	int fd;
	char dst[PATH_MAX];
	int is_dir;
	int optional; /* skip when the target cannot be made (read-only image) */
};

static int clone_tree(struct tree *t, const char *src, const char *dst, int readonly,
		      int optional, int as_user)
{
	struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
	struct stat st;
	int fsuid = 0, fsgid = 0;

	if (as_user) {
		/* The user's own rights decide what they may mount, not root's. */
		fsgid = setfsgid(step.gid);
		fsuid = setfsuid(step.uid);
	}
	t->fd = syscall(SYS_open_tree, AT_FDCWD, src,
			OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
	if (t->fd >= 0 && fstat(t->fd, &st) < 0)
		st.st_mode = 0;
	if (as_user) {
		setfsuid(fsuid);
		setfsgid(fsgid);
	}
	if (t->fd < 0) {
		if (optional)
			return 0;
		slurm_error(LOG_PREFIX "cannot mount %s: %s", src, strerror(errno));
		return -1;
	}
	if (readonly)
		attr.attr_set |= MOUNT_ATTR_RDONLY;
	if (syscall(SYS_mount_setattr, t->fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
		    sizeof(attr)) < 0 &&
	    readonly) {
		slurm_error(LOG_PREFIX "cannot make %s read-only: %s", src, strerror(errno));
		return -1;
	}
	snprintf(t->dst, sizeof(t->dst), "%s", dst);
	t->is_dir = S_ISDIR(st.st_mode);
	t->optional = optional;
	return 0;
}

/* Inside the container (after pivot_root): make dst and attach the tree there. */
static int attach_tree(struct tree *t)
{
	char parent[PATH_MAX];
	struct stat st;

	if (t->fd < 0)
		return 0;
	if (stat(t->dst, &st) < 0) {
		snprintf(parent, sizeof(parent), "%s", t->dst);
		*strrchr(parent, '/') = '\0';
		if (t->is_dir) {
			if (mkdir_p(t->dst, 0755) < 0)
				goto cannot;
		} else {
			int fd;

			if ((*parent && mkdir_p(parent, 0755) < 0) ||
			    (fd = open(t->dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) < 0)
				goto cannot;
			close(fd);
		}
	}
	if (syscall(SYS_move_mount, t->fd, "", AT_FDCWD, t->dst, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
		slurm_error(LOG_PREFIX "cannot mount at %s in the container: %s", t->dst, strerror(errno));
		return -1;
	}
	close(t->fd);
	t->fd = -1;
	return 0;
cannot:
	close(t->fd);
	t->fd = -1;
	if (t->optional)
		return 0;
	slurm_error(LOG_PREFIX "cannot make %s in the container: %s", t->dst, strerror(errno));
	return -1;
}

static void make_user_dir(const char *path)
{
	struct stat st;

	if (stat(path, &st) == 0 || errno != ENOENT || args.writable == 0)
		return;
	if (mkdir_p(path, 0755) == 0)
		(void)!chown(path, step.uid, step.gid);
}

/* The image's ENV wins over the job's, as with pyxis (PATH above all). */
static int apply_image_env(spank_t sp)
{
	char path[PATH_MAX + 8], line[65536];
	FILE *f;

	snprintf(path, sizeof(path), "%s/env", step.image_dir);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		char *eq;

		line[strcspn(line, "\n")] = '\0';
		eq = strchr(line, '=');
		if (!eq || eq == line)
			continue;
		*eq = '\0';
		if (spank_setenv(sp, line, eq + 1, 1) != ESPANK_SUCCESS) {
			fclose(f);
			slurm_error(LOG_PREFIX "cannot set %s", line);
			return -1;
		}
	}
	fclose(f);
	return 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	struct tree trees[16 + MAX_MOUNTS];
	size_t n = 0;
	char cwd[PATH_MAX], path[PATH_MAX + 16];
	int mount_home = args.mount_home == -1 ? config.mount_home : args.mount_home;
	struct passwd *pw;
	int rc = -1;

	if (!step.enabled)
		return 0;
	if (step.error[0]) {
		slurm_error(LOG_PREFIX "%s", step.error);
		return -1;
	}
	for (size_t i = 0; i < sizeof(trees) / sizeof(trees[0]); i++)
		trees[i].fd = -1;
	if (!getcwd(cwd, sizeof(cwd)))
		snprintf(cwd, sizeof(cwd), "/");
	pw = getpwuid(step.uid);
	/* Before the node's files go out of sight; Slurm looks up the command with this PATH. */
	if (apply_image_env(sp) < 0)
		return -1;

	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
		slurm_error(LOG_PREFIX "cannot make a mount namespace: %s", strerror(errno));
		return -1;
	}
	/* What the node lends the container, taken while its paths still mean the node's. */
	if (clone_tree(&trees[n++], "/proc", "/proc", 0, 0, 0) < 0 ||
	    clone_tree(&trees[n++], "/sys", "/sys", 1, 0, 0) < 0 ||
	    clone_tree(&trees[n++], "/dev", "/dev", 0, 0, 0) < 0 ||
	    clone_tree(&trees[n++], "/tmp", "/tmp", 0, 1, 0) < 0 ||
	    /* the batch script, PMIx's rendezvous directory */
	    clone_tree(&trees[n++], config.spool, config.spool, 0, 1, 0) < 0 ||
	    clone_tree(&trees[n++], "/etc/hosts", "/etc/hosts", 1, 1, 0) < 0 ||
	    clone_tree(&trees[n++], "/etc/hostname", "/etc/hostname", 1, 1, 0) < 0 ||
	    clone_tree(&trees[n++], "/etc/resolv.conf", "/etc/resolv.conf", 1, 1, 0) < 0)
		goto out;
	snprintf(path, sizeof(path), "%s/passwd", step.step_dir);
	if (clone_tree(&trees[n++], path, "/etc/passwd", 1, 1, 0) < 0)
		goto out;
	snprintf(path, sizeof(path), "%s/group", step.step_dir);
	if (clone_tree(&trees[n++], path, "/etc/group", 1, 1, 0) < 0)
		goto out;
	if (mount_home && pw && pw->pw_dir[0] == '/' &&
	    clone_tree(&trees[n++], pw->pw_dir, pw->pw_dir, 0, 0, 1) < 0)
		goto out;
	for (size_t i = 0; i < args.mounts_len; i++) {
		char src[PATH_MAX * 2 + 2];

		/* A relative source is relative to the step's working directory, as with pyxis. */
		if (args.mounts[i].src[0] == '/')
			snprintf(src, sizeof(src), "%s", args.mounts[i].src);
		else
			snprintf(src, sizeof(src), "%s/%s", cwd, args.mounts[i].src);
		if (clone_tree(&trees[n++], src, args.mounts[i].dst, args.mounts[i].readonly, 0, 1) < 0)
			goto out;
	}

	if (chdir(step.root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
	    umount2(".", MNT_DETACH) < 0 || chdir("/") < 0) {
		slurm_error(LOG_PREFIX "cannot enter the container: %s", strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (attach_tree(&trees[i]) < 0)
			goto out;
	/*
	 * Slurm changes to the job's directory after this hook (falling back to
	 * /tmp, with an error, where the image lacks it), and task_init below to
	 * --container-workdir: both are made for the user in the writable layer
	 * when the image lacks them, as a Dockerfile's WORKDIR would be.
	 */
	make_user_dir(cwd);
	if (args.workdir)
		make_user_dir(args.workdir);
	/* Nothing in the image (setuid files, file capabilities) may raise privileges. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		slurm_error(LOG_PREFIX "cannot set no_new_privs: %s", strerror(errno));
		goto out;
	}
	rc = 0;
out:
	for (size_t i = 0; i < n; i++)
		if (trees[i].fd >= 0)
			close(trees[i].fd);
	return rc;
}

/* As the user, after Slurm's own chdir to the job's directory. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	if (!step.enabled || !args.workdir)
		return 0;
	if (chdir(args.workdir) < 0) {
		slurm_error(LOG_PREFIX "cannot change to --container-workdir %s: %s", args.workdir,
			    strerror(errno));
		return -1;
	}
	spank_setenv(sp, "PWD", args.workdir, 1);
	return 0;
}

/* ------------------------------------------------------------------ clean-up */

static void remove_job_containers(uint32_t jobid)
{
	char path[CONFIG_PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/jobs/%u", config.cache, jobid);
	remove_tree(path);
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	uint32_t jobid, stepid;

	if (spank_context() != S_CTX_REMOTE)
		return 0;
	/*
	 * Named containers live as long as their job on this node, which is as
	 * long as the job's extern step (PrologFlags=Contain, the chart's default).
	 */
	if (spank_get_item(sp, S_JOB_STEPID, &stepid) == ESPANK_SUCCESS &&
	    stepid == SLURM_EXTERN_CONT && spank_get_item(sp, S_JOB_ID, &jobid) == ESPANK_SUCCESS)
		remove_job_containers(jobid);
	if (!step.enabled)
		return 0;
	if (step.mounted && umount2(step.root, MNT_DETACH) < 0)
		slurm_error(LOG_PREFIX "cannot unmount %s: %s", step.root, strerror(errno));
	step.mounted = 0;
	if (!step.named)
		remove_tree(step.step_dir);
	return 0;
}

/* The same without an extern step, where Slurm runs SPANK's job epilog. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t jobid;

	if (spank_get_item(sp, S_JOB_ID, &jobid) == ESPANK_SUCCESS)
		remove_job_containers(jobid);
	return 0;
}
