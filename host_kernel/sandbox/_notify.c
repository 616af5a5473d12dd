/* _host_kernel_notify: the tracing supervisor's common call, served in C.
 *
 * host_kernel/sandbox/trace.py's Supervisor serves each seccomp user notification
 * of a confined session: it reads the call, reads the path from the caller's memory,
 * keeps the access when it falls under the session's roots, and lets the call
 * continue. Most calls a session makes are opens for reading (a cell reading ten
 * thousand files makes ten thousand), and for those the Python loop's own work was
 * half of each round trip. serve() here does exactly what the Python code does for
 * such an open, on the Supervisor's own objects (its index, list of accesses,
 * counter, caches of working folders and memory descriptors), and answers the call.
 * Anything else, and anything out of the ordinary on the way (a path with "." or
 * ".." or "//" in it, one under a folder to be resolved, an unreadable path, a
 * thread whose memory descriptor is not open yet while many are), it hands back
 * unanswered, as the notification's numbers, for the Python code to serve: the
 * Python Supervisor stays the one definition of what is recorded, and this module
 * only a faster way through its most common case. Built as a separate top-level
 * module (pyproject.toml, ext-modules) so a source tree finds the installed one;
 * trace.py checks ABI before using it.
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* O_PATH, memmem */
#endif
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The protocol with trace.py: bump it whenever what serve() takes or returns changes. */
#define ABI 1

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SECCOMP_USER_NOTIF_FLAG_CONTINUE
#define SECCOMP_USER_NOTIF_FLAG_CONTINUE (1UL << 0)
#endif

#define PAGE 4096
#define FIRST_READ 256
/* The Python Supervisor keeps at most this many /proc/TID/mem descriptors before it
 * closes some: past it, a new thread is left to Python. */
#define MAX_MEM_FDS 256

enum { SLOW = 0, DONE = 1 };

static PyObject *s_sources, *s_moving, *s_mem, *s_cwd, *s_roots, *s_resolve, *s_stamp_reads,
    *s_index, *s_last, *s_accesses, *s_limit, *s_dropped, *s_seen, *s_counter, *s_read;

/* What an open with these flags does, as trace.py's _open_kind says: 1 for a read. */
static int
is_read(uint64_t flags)
{
    if (flags & O_PATH)
        return 1;
    uint64_t mode = flags & O_ACCMODE;
    if (mode == O_WRONLY || mode == O_RDWR)
        return 0;
    return !(flags & (O_TRUNC | O_CREAT));
}

/* Bytes of the caller's memory at addr (pread of /proc/TID/mem); -1 on failure. */
static ssize_t
peek(int fd, void *buf, size_t size, uint64_t addr)
{
    return pread(fd, buf, size, (off_t)addr);  /* never blocks: memory of a stopped caller */
}

/* A borrowed attribute value: the new reference is dropped at once, since the
 * Supervisor holds its attributes for as long as serve() runs. NULL with an error. */
static PyObject *
attr(PyObject *sup, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(sup, name);
    if (value != NULL)
        Py_DECREF(value);
    return value;
}

/* The caller's memory descriptor, from the Supervisor's _mem (opened and kept there
 * when missing); -1 when Python should open it (many open already), -2 on an error. */
static int
mem_fd(PyObject *sup, PyObject *tid)
{
    PyObject *mem = attr(sup, s_mem);
    if (mem == NULL || !PyDict_Check(mem))
        return -2;
    PyObject *fd = PyDict_GetItemWithError(mem, tid);
    if (fd != NULL)
        return (int)PyLong_AsLong(fd);
    if (PyErr_Occurred())
        return -2;
    if (PyDict_GET_SIZE(mem) > MAX_MEM_FDS)
        return -1;
    char name[64];
    snprintf(name, sizeof name, "/proc/%ld/mem", PyLong_AsLong(tid));
    int opened = open(name, O_RDONLY | O_CLOEXEC);
    if (opened < 0)
        return -1;
    PyObject *value = PyLong_FromLong(opened);
    if (value == NULL || PyDict_SetItem(mem, tid, value) < 0) {
        Py_XDECREF(value);
        close(opened);
        return -2;
    }
    Py_DECREF(value);
    return opened;
}

/* The path argument at addr, NUL-terminated in out (2 pages); its length, 0 when the
 * call names none (a NULL pointer, or no NUL within two pages: nothing is kept), -1
 * when Python should read it (unreadable, or empty). */
static ssize_t
read_path(int fd, uint64_t addr, char *out)
{
    if (addr == 0)
        return 0;
    /* As trace.py's _path reads it: to the end of the page, then one page more. A short
     * first read (most paths are short) spares copying the rest of the page. */
    size_t size = PAGE - addr % PAGE;
    size_t first = size < FIRST_READ ? size : FIRST_READ;
    ssize_t got = peek(fd, out, first, addr);
    if (got <= 0)
        return -1;
    char *end = memchr(out, '\0', (size_t)got);
    if (end == NULL && (size_t)got == first && first < size) {
        ssize_t rest = peek(fd, out + first, size - first, addr + first);
        if (rest > 0) {
            end = memchr(out + first, '\0', (size_t)rest);
            got = (ssize_t)first + rest;
        }
    }
    if (end == NULL && (size_t)got == size) {
        ssize_t more = peek(fd, out + size, PAGE, addr + size);
        if (more > 0) {
            end = memchr(out + size, '\0', (size_t)more);
        }
    }
    if (end == out)
        return -1;
    return end == NULL ? 0 : end - out;
}

/* The caller's working folder as bytes (a new reference), from the Supervisor's _cwd,
 * read and kept there (unless a thread is changing folder) when missing. NULL with no
 * error when it cannot be read (Python then decides); NULL with an error on failure. */
static PyObject *
working_folder(PyObject *sup, PyObject *tid, long ntid, int moving)
{
    PyObject *cwd = attr(sup, s_cwd);
    if (cwd == NULL || !PyDict_Check(cwd))
        return NULL;
    PyObject *base = PyDict_GetItemWithError(cwd, tid);
    if (base != NULL)
        return PyUnicode_EncodeFSDefault(base);
    if (PyErr_Occurred())
        return NULL;
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/%ld/cwd", ntid);
    ssize_t n = readlink(link, target, sizeof target);
    if (n <= 0 || (size_t)n >= sizeof target)
        return NULL;
    PyObject *decoded = PyUnicode_DecodeFSDefaultAndSize(target, n);
    if (decoded == NULL)
        return NULL;
    if (!moving && PyDict_SetItem(cwd, tid, decoded) < 0) {
        Py_DECREF(decoded);
        return NULL;
    }
    Py_DECREF(decoded);
    return PyBytes_FromStringAndSize(target, n);
}

/* A path trace.py's _path would change: one with ".." after a slash (resolved as the
 * kernel resolves it) or "//", a "." name, or "/." and a trailing slash (normalised).
 * Hidden names ("/.venv/") are left as they are there, and here. */
static int
needs_python(const char *raw, size_t len)
{
    if (memmem(raw, len, "/..", 3) != NULL || memmem(raw, len, "//", 2) != NULL)
        return 1;
    int dotted = 0;
    for (const char *at = raw; (at = memmem(at, len - (size_t)(at - raw), "/.", 2)) != NULL;
         at += 2) {
        dotted = 1;
        if ((size_t)(at - raw) + 2 == len || at[2] == '/')
            return 1;  /* a "." name */
    }
    return dotted && raw[len - 1] == '/';
}

static int
starts_with_any(PyObject *path, PyObject *prefixes)
{
    if (!PyTuple_Check(prefixes))
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        Py_ssize_t hit = PyUnicode_Tailmatch(path, PyTuple_GET_ITEM(prefixes, i), 0,
                                             PY_SSIZE_T_MAX, -1);
        if (hit != 0)
            return (int)hit;  /* 1, or -1 on an error */
    }
    return 0;
}

/* (size, mtime_ns, ctime_ns, inode) of what the open will find (symlinks followed), or
 * None (trace.py's _stamp). A new reference; NULL on an error. */
static PyObject *
stamp_of(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        Py_RETURN_NONE;
    return Py_BuildValue(
        "(LLLK)", (long long)st.st_size,
        (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
        (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec,
        (unsigned long long)st.st_ino);
}

/* One more access seen: the Supervisor's seen count and the shared counter (bump()). */
static int
bump(PyObject *sup)
{
    PyObject *seen = attr(sup, s_seen);
    if (seen == NULL)
        return -1;
    unsigned long long n = PyLong_AsUnsignedLongLong(seen) + 1;
    if (PyErr_Occurred())
        return -1;
    PyObject *value = PyLong_FromUnsignedLongLong(n);
    if (value == NULL || PyObject_SetAttr(sup, s_seen, value) < 0) {
        Py_XDECREF(value);
        return -1;
    }
    Py_DECREF(value);
    PyObject *counter = attr(sup, s_counter);
    if (counter == NULL)
        return -1;
    if (counter == Py_None)
        return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(counter, &view, PyBUF_WRITABLE) < 0)
        return -1;
    int ok = view.len >= 8;
    if (ok) {
        unsigned char *b = view.buf;
        for (int i = 0; i < 8; i++)
            b[i] = (unsigned char)(n >> (8 * i));  /* little-endian, as struct "<Q" */
    }
    PyBuffer_Release(&view);
    return ok ? 0 : -1;
}

/* Keep (t, source, "r", path[, stamp]) as Supervisor._keep keeps a read. */
static int
keep_read(PyObject *sup, PyObject *source, PyObject *path, const char *raw)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    PyObject *t = PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    PyObject *key = NULL, *entry = NULL, *stamp = NULL;
    int rc = -1;
    if (t == NULL)
        goto done;
    PyObject *stamp_reads = attr(sup, s_stamp_reads);
    int stamping = stamp_reads == NULL ? -1 : PyObject_IsTrue(stamp_reads);
    if (stamping < 0)
        goto done;
    key = PyTuple_Pack(3, source, s_read, path);
    if (key == NULL)
        goto done;
    if (stamping) {
        stamp = stamp_of(raw);
        if (stamp == NULL)
            goto done;
        entry = PyTuple_Pack(5, t, source, s_read, path, stamp);
    } else {
        entry = PyTuple_Pack(4, t, source, s_read, path);
    }
    if (entry == NULL)
        goto done;
    PyObject *index = attr(sup, s_index);
    PyObject *accesses = attr(sup, s_accesses);
    if (index == NULL || accesses == NULL || !PyDict_Check(index) || !PyList_Check(accesses))
        goto done;
    int known = PyDict_Contains(index, key);
    if (known < 0)
        goto done;
    if (known) {
        /* Seen before this collection: its latest sighting only. */
        PyObject *last = attr(sup, s_last);
        if (last == NULL || PyObject_SetItem(last, key, entry) < 0)
            goto done;
    } else {
        PyObject *limit = attr(sup, s_limit);
        if (limit == NULL)
            goto done;
        Py_ssize_t most = PyLong_AsSsize_t(limit);
        if (most == -1 && PyErr_Occurred())
            goto done;
        if (PyList_GET_SIZE(accesses) >= most) {
            PyObject *dropped = attr(sup, s_dropped);
            Py_ssize_t count = dropped == NULL ? -1 : PyLong_AsSsize_t(dropped);
            if (count == -1 && PyErr_Occurred())
                goto done;
            PyObject *more = PyLong_FromSsize_t(count + 1);
            if (more == NULL || PyObject_SetAttr(sup, s_dropped, more) < 0) {
                Py_XDECREF(more);
                goto done;
            }
            Py_DECREF(more);
        } else {
            PyObject *at = PyLong_FromSsize_t(PyList_GET_SIZE(accesses));
            if (at == NULL || PyDict_SetItem(index, key, at) < 0) {
                Py_XDECREF(at);
                goto done;
            }
            Py_DECREF(at);
            if (PyList_Append(accesses, entry) < 0)
                goto done;
        }
    }
    rc = bump(sup);
done:
    Py_XDECREF(t);
    Py_XDECREF(key);
    Py_XDECREF(entry);
    Py_XDECREF(stamp);
    return rc;
}

/* The fast path: DONE when the call was an open for reading and was fully served (kept
 * or not), SLOW when Python must serve it, -1 with a Python error. */
static int
fast(PyObject *sup, int listener, const struct seccomp_notif *req)
{
    int nr = req->data.nr;
    uint64_t dirfd, addr, flags;
#ifdef SYS_open
    if (nr == SYS_open) {
        dirfd = (uint64_t)(int64_t)AT_FDCWD;
        addr = req->data.args[0];
        flags = req->data.args[1];
    } else
#endif
    if (nr == SYS_openat || nr == SYS_openat2) {
        dirfd = req->data.args[0];
        addr = req->data.args[1];
        flags = req->data.args[2];
    } else {
        return SLOW;
    }
    PyObject *tid = PyLong_FromUnsignedLong(req->pid);
    if (tid == NULL)
        return -1;
    int rc = -1;
    PyObject *base = NULL, *path = NULL;
    /* As _note does first: a thread seen again has finished any chdir it made. */
    PyObject *moving = attr(sup, s_moving);
    if (moving == NULL || !PySet_Check(moving))
        goto out;
    int was_moving = PySet_GET_SIZE(moving) > 0;
    if (was_moving && PySet_Discard(moving, tid) < 0)
        goto out;
    int fd = mem_fd(sup, tid);
    if (fd == -2)
        goto out;
    rc = SLOW;
    if (fd < 0)
        goto out;
    if (nr == SYS_openat2) {
        uint64_t how;
        if (peek(fd, &how, sizeof how, flags) != (ssize_t)sizeof how)
            goto out;
        flags = how;
    }
    if (!is_read(flags))
        goto out;
    char buf[2 * PAGE + PATH_MAX + 2];
    char *raw = buf + PATH_MAX + 1;  /* room before it for the folder it is relative to */
    ssize_t len = read_path(fd, addr, raw);
    if (len < 0)
        goto out;
    if (len == 0) {
        rc = DONE;  /* no path to keep (as _path's None) */
        goto out;
    }
    if (raw[0] != '/') {
        size_t folder_len;
        const char *folder;
        char target[PATH_MAX];
        if ((uint32_t)dirfd == (uint32_t)AT_FDCWD) {
            base = working_folder(sup, tid, (long)req->pid, PySet_GET_SIZE(moving) > 0);
            if (base == NULL) {
                rc = PyErr_Occurred() ? -1 : SLOW;
                goto out;
            }
            folder = PyBytes_AS_STRING(base);
            folder_len = (size_t)PyBytes_GET_SIZE(base);
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/%u/fd/%u", req->pid, (uint32_t)dirfd);
            ssize_t n = readlink(link, target, sizeof target);
            if (n <= 0 || (size_t)n >= sizeof target)
                goto out;
            folder = target;
            folder_len = (size_t)n;
        }
        if (folder_len > PATH_MAX)
            goto out;
        raw -= folder_len + 1;
        memcpy(raw, folder, folder_len);
        raw[folder_len] = '/';
        len += (ssize_t)folder_len + 1;
    }
    if (needs_python(raw, (size_t)len))
        goto out;
    path = PyUnicode_DecodeFSDefaultAndSize(raw, len);
    if (path == NULL) {
        rc = -1;
        goto out;
    }
    PyObject *resolve = attr(sup, s_resolve), *roots = attr(sup, s_roots);
    if (resolve == NULL || roots == NULL) {
        rc = -1;
        goto out;
    }
    int under = starts_with_any(path, resolve);
    if (under != 0) {
        rc = under < 0 ? -1 : SLOW;  /* resolved first, in Python */
        goto out;
    }
    under = starts_with_any(path, roots);
    if (under <= 0) {
        rc = under < 0 ? -1 : DONE;  /* outside the session's folders: not kept */
        goto out;
    }
    PyObject *sources = attr(sup, s_sources);
    if (sources == NULL || !PyDict_Check(sources)) {
        rc = -1;
        goto out;
    }
    PyObject *key = PyLong_FromLong(listener);
    if (key == NULL) {
        rc = -1;
        goto out;
    }
    PyObject *source = PyDict_GetItemWithError(sources, key);
    Py_DECREF(key);
    if (source == NULL) {
        rc = -1;
        if (!PyErr_Occurred())
            rc = SLOW;  /* a listener it does not know: Python records it as source -1 */
        goto out;
    }
    rc = keep_read(sup, source, path, raw) < 0 ? -1 : DONE;
out:
    Py_XDECREF(base);
    Py_XDECREF(path);
    Py_DECREF(tid);
    return rc;
}

static void
answer(int listener, uint64_t id)
{
    struct seccomp_notif_resp resp;
    memset(&resp, 0, sizeof resp);
    resp.id = id;
    resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);  /* the caller may be gone: fine */
}

static PyObject *
serve(PyObject *module, PyObject *args)
{
    PyObject *sup;
    int listener;
    if (!PyArg_ParseTuple(args, "Oi", &sup, &listener))
        return NULL;
    struct seccomp_notif req;
    memset(&req, 0, sizeof req);
    int rc, err;
    Py_BEGIN_ALLOW_THREADS
    rc = ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req);
    err = errno;
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        /* ENOENT: the caller went away before it was read; EINTR: try again later. */
        if (err == ENOENT || err == EINTR)
            Py_RETURN_TRUE;
        Py_RETURN_FALSE;
    }
    int done = fast(sup, listener, &req);
    if (done < 0) {
        /* Never leave a caller waiting on our account: Python serves it from scratch. */
        PyErr_Clear();
        done = SLOW;
    }
    if (done == DONE) {
        answer(listener, req.id);
        Py_RETURN_TRUE;
    }
    return Py_BuildValue("(KIiKKKKK)", (unsigned long long)req.id, req.pid, req.data.nr,
                         (unsigned long long)req.data.args[0],
                         (unsigned long long)req.data.args[1],
                         (unsigned long long)req.data.args[2],
                         (unsigned long long)req.data.args[3],
                         (unsigned long long)req.data.args[4]);
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS,
     "serve(supervisor, listener) -> True | False | (id, tid, nr, a0, a1, a2, a3, a4)\n\n"
     "Receive one notification on listener. An open for reading is served as the\n"
     "Supervisor's Python code would serve it, and answered: True. False: the listener\n"
     "has no more callers. Otherwise the notification, unanswered, for Python to serve.\n"
     "(Waiting in C for the same caller's next call was measured slower than going back\n"
     "through init's poll loop, so each call is one serve.)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_host_kernel_notify",
    .m_doc = "The tracing supervisor's common call (an open for reading), served in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__host_kernel_notify(void)
{
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_sources, "sources"}, {&s_moving, "_moving"}, {&s_mem, "_mem"}, {&s_cwd, "_cwd"},
        {&s_roots, "roots"}, {&s_resolve, "resolve"}, {&s_stamp_reads, "stamp_reads"},
        {&s_index, "_index"}, {&s_last, "_last"}, {&s_accesses, "accesses"},
        {&s_limit, "limit"}, {&s_dropped, "dropped"}, {&s_seen, "seen"},
        {&s_counter, "counter"}, {&s_read, "r"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
