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
 *                        the command: a mount namespace of its own, a /proc of its own
 *                        (hidepid=invisible), a /dev of its own with the step's devices
 *                        only, the node's /sys, /tmp, Slurm's spool,
 *                        /etc/hosts and friends, the user's passwd entry and the user's
 *                        --container-mounts cloned (open_tree) from the node, pivot_root
 *                        into the step's root, the clones attached inside (move_mount:
 *                        paths resolve inside the image, never on the node, never
 *                        through a magic link), no_new_privs, the image's ENV.
 *   exit                 the step's root unmounted and, unless named, removed.
 *
 * The task stays Slurm's own process: the same cgroup, uid, signals, stdio and
 * accounting as any step; only its view of the filesystem changes. Every mount is
 * nosuid (and no_new_privs is set), so nothing in an image can raise privileges.
 *
 * The cache is root's alone (the chart makes it 0700; open_cache refuses it
 * otherwise), and every path below it is opened from its directory's descriptor
 * through no link (openat2), so nothing root writes or mounts there can be
 * redirected: see "The cache" below and docs/containers.md.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
/* /dev's own tree, the mounts on it and the GPU driver files */
#define MAX_DEV_TREES 160

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
	char gpu_edits[CONFIG_PATH_MAX];
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
	char image[128];    /* its directory's name under <cache>/images: <algorithm>-<hex> */
	char rel[PATH_MAX]; /* the step's directory, relative to the cache */
	char error[2048];   /* reported by the tasks, so srun shows it */
} step;

/* The cache's directory, opened and checked (open_cache), in slurmstepd's mount namespace. */
static int cache_fd = -1;

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
	snprintf(config.gpu_edits, sizeof(config.gpu_edits), "/run/sunk/gpu-edits");
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
		else if (!strncmp(av[i], "gpu_edits=", 10))
			target = config.gpu_edits;
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

/* ------------------------------------------------------------------ the cache */

/*
 * Every path below the cache is opened from a directory fd of it with openat2,
 * through no symlink and no magic link (/proc/self/fd/N, /proc/PID/root) and
 * never above it; paths inside a container are resolved in its root, through no
 * magic link. Nothing is looked up by a path string that someone else could
 * redirect while root walks it.
 */
#define RESOLVE_CACHE (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
#define RESOLVE_IMAGE (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
#define RESOLVE_LAYER (RESOLVE_IMAGE | RESOLVE_NO_XDEV)

static int open2(int dirfd, const char *path, int flags, mode_t mode, uint64_t resolve)
{
	struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC), .mode = mode, .resolve = resolve};
	int fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));

	if (fd < 0 && errno == ENOSYS)
		slurm_error(LOG_PREFIX "this kernel has no openat2 (Linux 5.6 or later): container steps are refused");
	return fd;
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* A directory of the cache: root's, and writable by root alone. */
static int root_only(int fd, const char *what)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return fail("cannot stat %s: %s", what, strerror(errno));
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022))
		return fail("%s must be a directory of root's that only root can write (it is uid %u, "
			    "mode %04o): container steps are refused",
			    what, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
	return 0;
}

/*
 * The cache's directory, each component of its path checked from /: no
 * symlink, root's, writable by root alone. Then no one else can create, rename
 * or replace anything below it.
 */
static int open_cache(void)
{
	char path[CONFIG_PATH_MAX], prefix[CONFIG_PATH_MAX] = "", *rest = path, *comp;
	int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return fail("cannot open /: %s", strerror(errno));
	if (root_only(fd, "/") < 0)
		goto bad;
	snprintf(path, sizeof(path), "%s", config.cache);
	while ((comp = strsep(&rest, "/")) != NULL) {
		int next;

		if (!*comp)
			continue;
		snprintf(prefix + strlen(prefix), sizeof(prefix) - strlen(prefix), "/%s", comp);
		next = open2(fd, comp, O_PATH | O_DIRECTORY, 0, RESOLVE_CACHE);
		close(fd);
		fd = next;
		if (fd < 0) {
			if (errno == ELOOP)
				return fail("the container cache %s: %s is a symbolic link: container steps "
					    "are refused", config.cache, prefix);
			return fail("cannot open the container cache %s: %s: %s", config.cache, prefix,
				    strerror(errno));
		}
		if (root_only(fd, prefix) < 0)
			goto bad;
	}
	return fd;
bad:
	close(fd);
	return -1;
}

/* dir/name, one component, made with mode when missing; root's alone. */
static int open_dir(int dir, const char *name, mode_t mode)
{
	char what[CONFIG_PATH_MAX + 128];
	int fd = open2(dir, name, O_RDONLY | O_DIRECTORY, 0, RESOLVE_CACHE);

	if (fd < 0 && errno == ENOENT) {
		if (mkdirat(dir, name, mode) < 0 && errno != EEXIST)
			return fail("cannot make %s in the container cache: %s", name, strerror(errno));
		fd = open2(dir, name, O_RDONLY | O_DIRECTORY, 0, RESOLVE_CACHE);
		if (fd >= 0 && fchmod(fd, mode) < 0)
			close_fd(&fd);
	}
	if (fd < 0)
		return fail("cannot open %s in the container cache: %s", name, strerror(errno));
	snprintf(what, sizeof(what), "%s in the container cache %s", name, config.cache);
	if (root_only(fd, what) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A new file dir/name (whatever was there is removed, never followed), for writing. */
static FILE *create_file(int dir, const char *name)
{
	int fd;
	FILE *f;

	if (unlinkat(dir, name, 0) < 0 && errno != ENOENT)
		return NULL;
	fd = open2(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644, RESOLVE_CACHE);
	if (fd < 0)
		return NULL;
	if (fchmod(fd, 0644) < 0 || !(f = fdopen(fd, "w"))) {
		close(fd);
		return NULL;
	}
	return f;
}

/* A regular file at path below dir, resolved as resolve says, for reading; never a FIFO. */
static FILE *open_file(int dir, const char *path, uint64_t resolve)
{
	struct stat st;
	int fd = open2(dir, path, O_RDONLY | O_NONBLOCK, 0, resolve);
	FILE *f;

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !(f = fdopen(fd, "r"))) {
		close(fd);
		errno = EINVAL;
		return NULL;
	}
	return f;
}

/*
 * name below dir and everything below that: by file descriptors, never through
 * a link and never into another filesystem (a step's root still mounted).
 */
static void remove_at(int dir, const char *name, dev_t dev)
{
	struct stat st, opened;
	struct dirent *e;
	DIR *d;
	int fd;

	if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return;
	if (!S_ISDIR(st.st_mode)) {
		unlinkat(dir, name, 0);
		return;
	}
	if (st.st_dev != dev)
		return;
	fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &opened) < 0 || opened.st_dev != dev || opened.st_ino != st.st_ino ||
	    !(d = fdopendir(fd))) {
		close(fd);
		return;
	}
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			remove_at(dirfd(d), e->d_name, dev);
	closedir(d);
	unlinkat(dir, name, AT_REMOVEDIR);
}

/* rel (a relative path of the cache) and all below it. */
static void remove_tree(int cache, const char *rel)
{
	char parent[PATH_MAX], *slash;
	struct stat st;
	int dir;

	snprintf(parent, sizeof(parent), "%s", rel);
	slash = strrchr(parent, '/');
	if (!slash)
		return;
	*slash = '\0';
	dir = open2(cache, parent, O_RDONLY | O_DIRECTORY, 0, RESOLVE_CACHE);
	if (dir < 0)
		return;
	if (fstat(dir, &st) == 0)
		remove_at(dir, slash + 1, st.st_dev);
	close(dir);
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

/* An image directory's name as the fetcher makes it: <algorithm>-<hex>. */
static int valid_image_name(const char *name)
{
	if (!*name || *name == '-' || strlen(name) >= sizeof(step.image))
		return 0;
	for (const char *c = name; *c; c++)
		if (!islower((unsigned char)*c) && !isdigit((unsigned char)*c) && *c != '-')
			return 0;
	return 1;
}

/* The image in the node's cache (fetched if missing): step.image. */
static int fetch_image(const char *image)
{
	char out[4096], prefix[CONFIG_PATH_MAX + 16], *last, *end;
	int rc;

	rc = run((char *[]){config.fetcher, config.cache, (char *)image, NULL}, out, sizeof(out));
	end = out + strlen(out);
	while (end > out && end[-1] == '\n')
		*--end = '\0';
	if (rc != 0)
		return fail("cannot fetch %s: %s", image, out);
	last = strrchr(out, '\n');
	last = last ? last + 1 : out;
	snprintf(prefix, sizeof(prefix), "%s/images/", config.cache);
	if (strncmp(last, prefix, strlen(prefix)) || !valid_image_name(last + strlen(prefix)))
		return fail("the fetcher printed no image directory of the cache: %s", out);
	last += strlen(prefix);
	memcpy(step.image, last, strlen(last) + 1); /* checked: it fits */
	return 0;
}

/* A named container's image, written by the step that made it. */
static int read_image_name(int stepdir)
{
	char line[sizeof(step.image) + 2];
	FILE *f = open_file(stepdir, "image", RESOLVE_CACHE);
	int ok;

	if (!f)
		return -1;
	ok = fgets(line, sizeof(line), f) != NULL;
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	if (!ok || !valid_image_name(line))
		return -1;
	memcpy(step.image, line, strlen(line) + 1); /* checked: it fits */
	return 0;
}

/*
 * /etc/passwd and /etc/group for the container: the image's, plus the user's
 * entry and primary group from this node when the image lacks them (as enroot
 * does), so that `id`, `whoami` and ssh inside the container know the user.
 * The image's files are read in its root (a link in the image resolves there,
 * never on the node); what is written is a new file of the step's directory.
 */
static int write_identity(int root, int stepdir)
{
	struct passwd *pw = getpwuid(step.uid);
	struct group *gr = getgrgid(step.gid);
	char line[4096], entry[64];
	const char *files[] = {"passwd", "group"};

	for (int i = 0; i < 2; i++) {
		FILE *in = NULL, *out;
		int found = 0;
		unsigned long id = i == 0 ? step.uid : step.gid;

		out = create_file(stepdir, files[i]);
		if (!out)
			return fail("cannot write the container's %s: %s", files[i], strerror(errno));
		snprintf(entry, sizeof(entry), "etc/%s", files[i]);
		in = open_file(root, entry, RESOLVE_IMAGE);
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
			return fail("cannot write the container's %s", files[i]);
	}
	return 0;
}

/*
 * The container's root filesystem, mounted on <step>/root through file
 * descriptors (the new mount API; overlayfs' layers named as /proc/self/fd/N of
 * directories opened safely): an overlay of the image, or a read-only bind of
 * it. Returns the mount's fd: the container's root, here.
 */
static int mount_root(int stepdir)
{
	char lower[32], upper[32], work[32];
	int image = -1, lowerfd = -1, upperfd = -1, workfd = -1, target = -1, fs = -1, mnt = -1;
	char rel[sizeof(step.image) + 16];

	snprintf(rel, sizeof(rel), "images/%s", step.image);
	if ((image = open_dir(cache_fd, "images", 0700)) < 0)
		goto out;
	close(image);
	image = open2(cache_fd, rel, O_RDONLY | O_DIRECTORY, 0, RESOLVE_CACHE);
	if (image < 0) {
		fail("the image %s is not in the cache: %s", step.image, strerror(errno));
		goto out;
	}
	if (root_only(image, rel) < 0)
		goto out;
	if (faccessat(image, ".complete", F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		fail("the image %s is not complete in the cache", step.image);
		goto out;
	}
	lowerfd = open2(image, "rootfs", O_PATH | O_DIRECTORY, 0, RESOLVE_CACHE);
	if (lowerfd < 0) {
		fail("the image %s has no rootfs: %s", step.image, strerror(errno));
		goto out;
	}
	if ((target = open_dir(stepdir, "root", 0755)) < 0)
		goto out;
	if (args.writable == 0) {
		struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
						      MOUNT_ATTR_NODEV};

		mnt = (int)syscall(SYS_open_tree, lowerfd, "",
				   OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
		if (mnt < 0 || syscall(SYS_mount_setattr, mnt, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
				       sizeof(attr)) < 0) {
			fail("cannot mount the image read-only: %s", strerror(errno));
			goto out;
		}
	} else {
		if ((upperfd = open_dir(stepdir, "upper", 0755)) < 0 ||
		    (workfd = open_dir(stepdir, "work", 0700)) < 0)
			goto out;
		snprintf(lower, sizeof(lower), "/proc/self/fd/%d", lowerfd);
		snprintf(upper, sizeof(upper), "/proc/self/fd/%d", upperfd);
		snprintf(work, sizeof(work), "/proc/self/fd/%d", workfd);
		fs = (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
		if (fs < 0 ||
		    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "lowerdir", lower, 0) < 0 ||
		    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "upperdir", upper, 0) < 0 ||
		    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "workdir", work, 0) < 0 ||
		    syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
		    (mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
					MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0) {
			fail("cannot mount the container's overlay: %s", strerror(errno));
			goto out;
		}
	}
	if (syscall(SYS_move_mount, mnt, "", target, "",
		    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
		fail("cannot mount the container's root: %s", strerror(errno));
		close_fd(&mnt);
		goto out;
	}
	step.mounted = 1;
out:
	if (!step.mounted)
		close_fd(&mnt);
	close_fd(&image);
	close_fd(&lowerfd);
	close_fd(&upperfd);
	close_fd(&workfd);
	close_fd(&target);
	close_fd(&fs);
	return mnt;
}

static int prepare_step(spank_t sp)
{
	char name[32];
	int dir = -1, stepdir = -1, root = -1, rc = -1;

	if (spank_get_item(sp, S_JOB_UID, &step.uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &step.gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &step.jobid) != ESPANK_SUCCESS)
		return fail("cannot read the job's uid, gid or id");
	if (args.remap_root == 1)
		return fail("--container-remap-root is not supported: steps run as their user");
	if ((cache_fd = open_cache()) < 0)
		return -1;
	step.named = args.name != NULL;
	/* steps/<job>.<step>, or jobs/<job>/<name>: each directory made here, root's alone. */
	if (step.named) {
		snprintf(name, sizeof(name), "%u", step.jobid);
		snprintf(step.rel, sizeof(step.rel), "jobs/%u/%s", step.jobid, args.name);
		if ((dir = open_dir(cache_fd, "jobs", 0700)) < 0 ||
		    (stepdir = open_dir(dir, name, 0700)) < 0)
			goto out;
		close(dir);
		dir = stepdir;
		if ((stepdir = open_dir(dir, args.name, 0700)) < 0)
			goto out;
	} else {
		snprintf(name, sizeof(name), "%u.%u", step.jobid, step.stepid);
		snprintf(step.rel, sizeof(step.rel), "steps/%s", name);
		if ((dir = open_dir(cache_fd, "steps", 0700)) < 0 ||
		    (stepdir = open_dir(dir, name, 0700)) < 0)
			goto out;
	}

	if (step.named && read_image_name(stepdir) == 0) {
		/* An earlier step of this job made it: reuse it, as pyxis does. */
		slurm_verbose(LOG_PREFIX "reusing container %s", args.name);
	} else if (!args.image) {
		fail("no container named %s in this job on this node, and no --container-image",
		     args.name);
		goto out;
	} else {
		FILE *f;

		if (fetch_image(args.image) < 0)
			goto out;
		int bad = 0;

		if ((f = create_file(stepdir, "image")) != NULL) {
			bad = fprintf(f, "%s\n", step.image) < 0;
			bad = fclose(f) != 0 || bad;
		}
		if (!f || bad) {
			fail("cannot write the container's image in the cache: %s", strerror(errno));
			goto out;
		}
	}
	if ((root = mount_root(stepdir)) < 0)
		goto out;
	rc = write_identity(root, stepdir);
out:
	close_fd(&dir);
	close_fd(&stepdir);
	close_fd(&root);
	return rc;
}

static int read_gpu_edits(void); /* the container's /dev, below */

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
	if (prepare_step(sp) < 0 || read_gpu_edits() < 0)
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

/* A file of the step's directory (passwd, group) as a tree to attach, read-only. */
static int clone_step_file(struct tree *t, int stepdir, const char *name, const char *dst)
{
	struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
	int fd = open2(stepdir, name, O_PATH | O_NOFOLLOW, 0, RESOLVE_CACHE);

	if (fd >= 0) {
		t->fd = (int)syscall(SYS_open_tree, fd, "",
				     OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
		close(fd);
	}
	if (fd < 0 || t->fd < 0 ||
	    syscall(SYS_mount_setattr, t->fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
		slurm_error(LOG_PREFIX "cannot mount the container's %s: %s", name, strerror(errno));
		return -1;
	}
	snprintf(t->dst, sizeof(t->dst), "%s", dst);
	t->is_dir = 0;
	t->optional = 0;
	return 0;
}

/*
 * A fresh procfs for the container, of this PID namespace, hidepid=invisible:
 * the user sees their own processes only, so not the slurmd container's PID 1
 * and its /proc/1/root (the node's /proc, cloned, would show every process).
 */
static int new_proc(struct tree *t)
{
	int fs = (int)syscall(SYS_fsopen, "proc", FSOPEN_CLOEXEC);

	t->fd = -1;
	if (fs >= 0 && syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "hidepid", "invisible", 0) == 0 &&
	    syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
		t->fd = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
				     MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
	if (fs >= 0)
		close(fs);
	if (t->fd < 0) {
		slurm_error(LOG_PREFIX "cannot mount a /proc for the container: %s", strerror(errno));
		return -1;
	}
	snprintf(t->dst, sizeof(t->dst), "/proc");
	t->is_dir = 1;
	t->optional = 0;
	return 0;
}

/* ------------------------------------------------------------------ the container's /dev */

/*
 * The container's /dev is a tmpfs of its own, made from the slurmd container's
 * /dev: each device node the step may use made again (mknod) with its owner and
 * mode, each link made again, each mount on it (pts, shm, mqueue, ...) cloned.
 * Which devices the step may use is its device cgroup's answer (Slurm's
 * ConstrainDevices puts slurmstepd in the step's cgroup before the tasks fork),
 * so a GPU the step was not allocated is simply not there: the container sees
 * exactly the GPUs of the step's allocation, whatever its environment says.
 *
 * The node's CDI edits for its GPUs (sunk's GPU plugin resolves the node's CDI
 * specs for the slurmd pod, and the pod's start writes them to config.gpu_edits,
 * root's), one per line:
 *   gpu PATH        a GPU's device node, under /dev
 *   node PATH       a device node every GPU process opens (nvidiactl, nvidia-uvm, ...)
 *   mount PATH      a driver file (libcuda, nvidia-smi, ...), at the same path
 *   env NAME=VALUE
 * The nodes, mounts and environment come with the GPUs: a step that holds at
 * least one GPU gets them all, a step that holds none gets none of them.
 */
#define EDIT_PATH_MAX 512
#define MAX_EDITS 128

static struct {
	char gpu[MAX_EDITS][EDIT_PATH_MAX];
	size_t gpu_len;
	char node[MAX_EDITS][EDIT_PATH_MAX];
	size_t node_len;
	char mount[MAX_EDITS][EDIT_PATH_MAX];
	size_t mount_len;
	char env[MAX_EDITS][EDIT_PATH_MAX];
	size_t env_len;
	int present; /* the file exists: the GPU plugin resolved the node's CDI specs */
} gpu_edits;

static int add_edit(char list[][EDIT_PATH_MAX], size_t *len, const char *value, int is_path)
{
	if (*len >= MAX_EDITS || strlen(value) >= EDIT_PATH_MAX || (is_path && value[0] != '/') ||
	    (!is_path && (!strchr(value, '=') || value[0] == '=')))
		return -1;
	snprintf(list[(*len)++], EDIT_PATH_MAX, "%s", value);
	return 0;
}

/*
 * config.gpu_edits, root's (the pod's start writes it; nothing a user can write),
 * read once per step, before the tasks fork.
 */
static int read_gpu_edits(void)
{
	char line[EDIT_PATH_MAX + 16];
	struct stat st;
	FILE *f;
	int fd, lineno = 0;

	memset(&gpu_edits, 0, sizeof(gpu_edits));
	fd = open2(AT_FDCWD, config.gpu_edits, O_RDONLY | O_NONBLOCK, 0,
		   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & 022) || !(f = fdopen(fd, "r"))) {
		if (fd >= 0)
			close(fd);
		return fail("%s: not a file only root can write: container steps are refused on "
			    "this node", config.gpu_edits);
	}
	gpu_edits.present = 1;
	while (fgets(line, sizeof(line), f)) {
		char *value = strchr(line, ' ');
		int rc = -1;

		lineno++;
		line[strcspn(line, "\n")] = '\0';
		if (!line[0])
			continue;
		if (value) {
			*value++ = '\0';
			if (!strcmp(line, "gpu"))
				rc = add_edit(gpu_edits.gpu, &gpu_edits.gpu_len, value, 1);
			else if (!strcmp(line, "node"))
				rc = add_edit(gpu_edits.node, &gpu_edits.node_len, value, 1);
			else if (!strcmp(line, "mount"))
				rc = add_edit(gpu_edits.mount, &gpu_edits.mount_len, value, 1);
			else if (!strcmp(line, "env"))
				rc = add_edit(gpu_edits.env, &gpu_edits.env_len, value, 0);
		}
		if (rc < 0) {
			fclose(f);
			return fail("%s line %d: not one of gpu PATH, node PATH, mount PATH, "
				    "env NAME=VALUE: container steps are refused on this node",
				    config.gpu_edits, lineno);
		}
	}
	fclose(f);
	return 0;
}

static int listed(char list[][EDIT_PATH_MAX], size_t len, const char *path)
{
	for (size_t i = 0; i < len; i++)
		if (!strcmp(list[i], path))
			return 1;
	return 0;
}

/*
 * Whether the step's device cgroup lets it read or write the device node at
 * path: the kernel asks the device cgroup (v1's list, v2's BPF program) in
 * every permission check of a device node, access(2) included, and answers
 * EPERM for a device it denies. Nothing is opened (opening a GPU's node wakes
 * its driver). Making a node is no test: runc allows mknod of any device.
 */
static int step_may_use(const char *path)
{
	if (faccessat(AT_FDCWD, path, R_OK, 0) == 0 || errno != EPERM)
		return 1;
	return faccessat(AT_FDCWD, path, W_OK, 0) == 0 || errno != EPERM;
}

/* The node's device node `path` (st), made again at dst_dir/name, if the step may use it. */
static int copy_node(int dst_dir, const char *name, const struct stat *st, const char *path,
		     int *made)
{
	*made = 0;
	if (!step_may_use(path)) {
		slurm_debug(LOG_PREFIX "%s is not the step's: left out of the container", path);
		return 0;
	}
	if (mknodat(dst_dir, name, st->st_mode & (S_IFMT | 0777), st->st_rdev) < 0) {
		slurm_error(LOG_PREFIX "cannot make %s in the container: %s", path, strerror(errno));
		return -1;
	}
	if (fchownat(dst_dir, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0 ||
	    fchmodat(dst_dir, name, st->st_mode & 07777, 0) < 0) {
		slurm_error(LOG_PREFIX "cannot set the owner and mode of %s in the container: %s", path,
			    strerror(errno));
		return -1;
	}
	*made = 1;
	return 0;
}

struct dev_copy {
	dev_t devfs;          /* the node's /dev: entries on another file system are mounts */
	struct tree *trees;   /* where the mounts on it go, to attach after pivot_root */
	size_t *n, max;
	int gpus;             /* GPU device nodes made */
};

/* The node's /dev/<rel> (a directory) into the new /dev's dst (the same place), depth levels deep. */
static int copy_dev(struct dev_copy *c, int src, int dst, const char *rel, int depth)
{
	DIR *d;
	struct dirent *e;
	int rc = 0, fd = dup(src);

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		slurm_error(LOG_PREFIX "cannot read /dev%s: %s", rel, strerror(errno));
		return -1;
	}
	while (rc == 0 && (e = readdir(d))) {
		char path[PATH_MAX], target[PATH_MAX];
		struct stat st;
		ssize_t len;
		int made;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "/dev%s/%s", rel, e->d_name);
		if (fstatat(src, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* gone meanwhile */
		if (S_ISLNK(st.st_mode)) {
			len = readlinkat(src, e->d_name, target, sizeof(target) - 1);
			if (len < 0)
				continue;
			target[len] = '\0';
			if (symlinkat(target, dst, e->d_name) < 0) {
				slurm_error(LOG_PREFIX "cannot make %s in the container: %s", path,
					    strerror(errno));
				rc = -1;
			}
		} else if (st.st_dev != c->devfs) {
			/* A mount on /dev (pts, shm, mqueue, a file the kubelet binds): cloned. */
			struct tree *t = &c->trees[*c->n];
			struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID};
			int made_target;

			if (*c->n >= c->max) {
				slurm_error(LOG_PREFIX "too many mounts on /dev to give the container");
				rc = -1;
				break;
			}
			if (S_ISDIR(st.st_mode))
				made_target = mkdirat(dst, e->d_name, st.st_mode & 07777);
			else
				made_target = mknodat(dst, e->d_name, S_IFREG | 0644, 0);
			t->fd = (int)syscall(SYS_open_tree, src, e->d_name,
					     OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE |
						     AT_SYMLINK_NOFOLLOW);
			if (made_target < 0 || t->fd < 0 ||
			    syscall(SYS_mount_setattr, t->fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
				    sizeof(attr)) < 0) {
				slurm_error(LOG_PREFIX "cannot mount %s in the container: %s", path,
					    strerror(errno));
				close_fd(&t->fd);
				rc = -1;
				break;
			}
			snprintf(t->dst, sizeof(t->dst), "%s", path);
			t->is_dir = S_ISDIR(st.st_mode);
			t->optional = 0;
			(*c->n)++;
		} else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
			/* The GPUs' common nodes come later, and only with a GPU. */
			if (gpu_edits.present && listed(gpu_edits.node, gpu_edits.node_len, path))
				continue;
			rc = copy_node(dst, e->d_name, &st, path, &made);
			if (made && listed(gpu_edits.gpu, gpu_edits.gpu_len, path))
				c->gpus++;
		} else if (S_ISDIR(st.st_mode) && depth > 0) {
			char sub[PATH_MAX];
			int s, t;

			snprintf(sub, sizeof(sub), "%s/%s", rel, e->d_name);
			if (mkdirat(dst, e->d_name, st.st_mode & 07777) < 0 ||
			    (s = openat(src, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
				slurm_error(LOG_PREFIX "cannot make %s in the container: %s", path,
					    strerror(errno));
				rc = -1;
				break;
			}
			t = openat(dst, e->d_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			rc = t < 0 ? -1 : copy_dev(c, s, t, sub, depth - 1);
			close(s);
			if (t >= 0)
				close(t);
		}
		/* Regular files, FIFOs, sockets on /dev itself: not given. */
	}
	closedir(d);
	return rc;
}

/* dev/<path below /dev>, with its directories: the common node `path` of the node's /dev. */
static int add_common_node(int dev, const char *path)
{
	char rel[EDIT_PATH_MAX], *slash;
	struct stat st;
	int made;

	if (strncmp(path, "/dev/", 5) || strstr(path, "/../") || stat(path, &st) < 0 ||
	    !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)))
		return 0; /* not on this node's /dev: nothing to give */
	snprintf(rel, sizeof(rel), "%s", path + 5);
	for (slash = strchr(rel, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		if (mkdirat(dev, rel, 0755) < 0 && errno != EEXIST)
			return -1;
		*slash = '/';
	}
	return copy_node(dev, rel, &st, path, &made);
}

/*
 * The container's /dev, made now (in slurmstepd's view of the node) as a
 * detached tmpfs, its mounts and the step's GPU driver files added to trees
 * (from *n on, at most max) to attach after pivot_root.
 */
static int new_dev(spank_t sp, struct tree *trees, size_t *n, size_t max)
{
	struct dev_copy c = {.trees = trees, .n = n};
	struct tree *dev;
	struct stat st;
	int fs, src = -1, rc = -1;

	if (*n >= max)
		return -1;
	dev = &trees[(*n)++];
	c.max = max;
	fs = (int)syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
	dev->fd = -1;
	if (fs >= 0 && syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "mode", "0755", 0) == 0 &&
	    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", "64k", 0) == 0 &&
	    syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
		dev->fd = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
				       MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC);
	if (fs >= 0)
		close(fs);
	if (dev->fd < 0) {
		slurm_error(LOG_PREFIX "cannot mount a /dev for the container: %s", strerror(errno));
		return -1;
	}
	snprintf(dev->dst, sizeof(dev->dst), "/dev");
	dev->is_dir = 1;
	dev->optional = 0;
	src = open("/dev", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (src < 0 || fstat(src, &st) < 0) {
		slurm_error(LOG_PREFIX "cannot open /dev: %s", strerror(errno));
		goto out;
	}
	c.devfs = st.st_dev;
	if (copy_dev(&c, src, dev->fd, "", 3) < 0)
		goto out;
	if (c.gpus > 0) {
		for (size_t i = 0; i < gpu_edits.node_len; i++)
			if (add_common_node(dev->fd, gpu_edits.node[i]) < 0) {
				slurm_error(LOG_PREFIX "cannot make %s in the container: %s",
					    gpu_edits.node[i], strerror(errno));
				goto out;
			}
		for (size_t i = 0; i < gpu_edits.mount_len; i++) {
			if (*n >= max) {
				slurm_error(LOG_PREFIX "too many GPU driver files to mount");
				goto out;
			}
			/* Read-only, at the path the node's spec gives; left out of a read-only image. */
			if (clone_tree(&trees[(*n)++], gpu_edits.mount[i], gpu_edits.mount[i], 1, 1, 0) < 0)
				goto out;
		}
		for (size_t i = 0; i < gpu_edits.env_len; i++) {
			char name[EDIT_PATH_MAX], *eq;

			snprintf(name, sizeof(name), "%s", gpu_edits.env[i]);
			eq = strchr(name, '=');
			*eq = '\0';
			if (spank_setenv(sp, name, eq + 1, 1) != ESPANK_SUCCESS) {
				slurm_error(LOG_PREFIX "cannot set %s", name);
				goto out;
			}
		}
	}
	rc = 0;
out:
	if (src >= 0)
		close(src);
	return rc;
}

/*
 * Inside the container (root: its root directory): path made when missing, its
 * missing directories 0755 root's and itself a directory (mode) or an empty file.
 * Resolved in the container's root, through no magic link (/proc/1/root) and
 * across no mount: what is made is made in the container's own filesystem, by
 * file descriptors, never in a directory the node lends it (/tmp, Slurm's spool,
 * /proc, a --container-mounts source), whatever links the image (or a user, in a
 * named container) left. An O_PATH fd of it.
 */
static int make_in_root(int root, const char *path, int is_dir, mode_t mode)
{
	char buf[PATH_MAX], *slash, *name;
	size_t len;
	int parent, fd;

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	while ((len = strlen(buf)) > 1 && buf[len - 1] == '/')
		buf[len - 1] = '\0';
	slash = strrchr(buf, '/');
	name = slash ? slash + 1 : buf;
	if (!*name || !strcmp(name, ".") || !strcmp(name, "..")) {
		errno = EINVAL;
		return -1;
	}
	if (slash == buf)
		parent = open2(root, "/", O_PATH | O_DIRECTORY, 0, RESOLVE_LAYER);
	else if (slash) {
		*slash = '\0';
		parent = open2(root, buf, O_PATH | O_DIRECTORY, 0, RESOLVE_LAYER);
		if (parent < 0 && errno == ENOENT)
			parent = make_in_root(root, buf, 1, 0755);
	} else
		parent = open2(root, "/", O_PATH | O_DIRECTORY, 0, RESOLVE_LAYER);
	if (parent < 0)
		return -1;
	if (is_dir) {
		if (mkdirat(parent, name, mode) < 0 && errno != EEXIST)
			goto bad;
	} else {
		fd = openat(parent, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0 && errno != EEXIST)
			goto bad;
		if (fd >= 0)
			close(fd);
	}
	/* What is there now, never through a link (a dangling one: ELOOP). */
	fd = open2(parent, name, O_PATH, 0, RESOLVE_CACHE | RESOLVE_NO_XDEV);
	close(parent);
	return fd;
bad:
	close(parent);
	return -1;
}

/* Inside the container (after pivot_root): find or make dst and attach the tree there. */
static int attach_tree(struct tree *t, int root)
{
	int target;

	if (t->fd < 0)
		return 0;
	target = open2(root, t->dst, O_PATH, 0, RESOLVE_IMAGE);
	if (target < 0 && errno == ENOENT)
		target = make_in_root(root, t->dst, t->is_dir, 0755);
	if (target < 0) {
		int err = errno;

		close_fd(&t->fd);
		/* Not there and not to be made (a read-only image, a link leading out): go without. */
		if (t->optional)
			return 0;
		slurm_error(LOG_PREFIX "cannot mount at %s in the container: %s", t->dst, strerror(err));
		return -1;
	}
	if (syscall(SYS_move_mount, t->fd, "", target, "",
		    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
		slurm_error(LOG_PREFIX "cannot mount at %s in the container: %s", t->dst, strerror(errno));
		close(target);
		close_fd(&t->fd);
		return -1;
	}
	close(target);
	close_fd(&t->fd);
	return 0;
}

/* The step's working directory, made for the user in the writable layer when the image lacks it. */
static void make_user_dir(int root, const char *path)
{
	int fd = open2(root, path, O_PATH, 0, RESOLVE_IMAGE);

	if (fd >= 0 || errno != ENOENT || args.writable == 0) {
		close_fd(&fd);
		return;
	}
	fd = make_in_root(root, path, 1, 0755);
	if (fd >= 0) {
		(void)!fchownat(fd, "", step.uid, step.gid, AT_EMPTY_PATH);
		close(fd);
	}
}

/* The image's ENV wins over the job's, as with pyxis (PATH above all). */
static int apply_image_env(spank_t sp)
{
	char rel[sizeof(step.image) + 16], line[65536];
	FILE *f;

	snprintf(rel, sizeof(rel), "images/%s/env", step.image);
	f = open_file(cache_fd, rel, RESOLVE_CACHE);
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
	struct tree trees[16 + MAX_DEV_TREES + MAX_MOUNTS];
	size_t n = 0;
	char cwd[PATH_MAX];
	int mount_home = args.mount_home == -1 ? config.mount_home : args.mount_home;
	int cache = -1, stepdir = -1, root = -1;
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
	/* The cache again, in this mount namespace, and the step's root as mounted here. */
	if ((cache = open_cache()) < 0) {
		slurm_error(LOG_PREFIX "%s", step.error);
		goto out;
	}
	stepdir = open2(cache, step.rel, O_PATH | O_DIRECTORY, 0, RESOLVE_CACHE);
	root = stepdir < 0 ? -1 : open2(stepdir, "root", O_PATH | O_DIRECTORY, 0, RESOLVE_CACHE);
	if (root < 0) {
		slurm_error(LOG_PREFIX "cannot open the container's root: %s", strerror(errno));
		goto out;
	}
	/* What the node lends the container, taken while its paths still mean the node's. */
	if (new_proc(&trees[n++]) < 0 ||
	    clone_tree(&trees[n++], "/sys", "/sys", 1, 0, 0) < 0 ||
	    new_dev(sp, trees, &n, MAX_DEV_TREES + 2) < 0 ||
	    clone_tree(&trees[n++], "/tmp", "/tmp", 0, 1, 0) < 0 ||
	    /* the batch script, PMIx's rendezvous directory */
	    clone_tree(&trees[n++], config.spool, config.spool, 0, 1, 0) < 0 ||
	    clone_tree(&trees[n++], "/etc/hosts", "/etc/hosts", 1, 1, 0) < 0 ||
	    clone_tree(&trees[n++], "/etc/hostname", "/etc/hostname", 1, 1, 0) < 0 ||
	    clone_tree(&trees[n++], "/etc/resolv.conf", "/etc/resolv.conf", 1, 1, 0) < 0 ||
	    clone_step_file(&trees[n++], stepdir, "passwd", "/etc/passwd") < 0 ||
	    clone_step_file(&trees[n++], stepdir, "group", "/etc/group") < 0)
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

	if (fchdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
	    umount2(".", MNT_DETACH) < 0 || chdir("/") < 0) {
		slurm_error(LOG_PREFIX "cannot enter the container: %s", strerror(errno));
		goto out;
	}
	close_fd(&root);
	close_fd(&stepdir);
	close_fd(&cache);
	if ((root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) {
		slurm_error(LOG_PREFIX "cannot open the container's root: %s", strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (attach_tree(&trees[i], root) < 0)
			goto out;
	/*
	 * Slurm changes to the job's directory after this hook (falling back to
	 * /tmp, with an error, where the image lacks it), and task_init below to
	 * --container-workdir: both are made for the user in the writable layer
	 * when the image lacks them, as a Dockerfile's WORKDIR would be.
	 */
	make_user_dir(root, cwd);
	if (args.workdir)
		make_user_dir(root, args.workdir);
	/* Nothing in the image (setuid files, file capabilities) may raise privileges. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		slurm_error(LOG_PREFIX "cannot set no_new_privs: %s", strerror(errno));
		goto out;
	}
	rc = 0;
out:
	for (size_t i = 0; i < n; i++)
		close_fd(&trees[i].fd);
	close_fd(&root);
	close_fd(&stepdir);
	close_fd(&cache);
	/* Nothing of the cache stays open in the task. */
	close_fd(&cache_fd);
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
	char rel[32];

	if (cache_fd < 0 && (cache_fd = open_cache()) < 0) {
		slurm_error(LOG_PREFIX "%s", step.error);
		return;
	}
	snprintf(rel, sizeof(rel), "jobs/%u", jobid);
	remove_tree(cache_fd, rel);
}

/* The step's root, unmounted through a descriptor of it. */
static void unmount_root(void)
{
	char rel[sizeof(step.rel) + 8], self[32];
	int fd;

	snprintf(rel, sizeof(rel), "%s/root", step.rel);
	fd = open2(cache_fd, rel, O_PATH | O_DIRECTORY, 0, RESOLVE_CACHE);
	if (fd < 0) {
		slurm_error(LOG_PREFIX "cannot unmount %s/%s: %s", config.cache, rel, strerror(errno));
		return;
	}
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	if (umount2(self, MNT_DETACH) < 0)
		slurm_error(LOG_PREFIX "cannot unmount %s/%s: %s", config.cache, rel, strerror(errno));
	close(fd);
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
	if (!step.enabled || cache_fd < 0)
		return 0;
	if (step.mounted)
		unmount_root();
	step.mounted = 0;
	if (!step.named && step.rel[0])
		remove_tree(cache_fd, step.rel);
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
