/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 so that the real pynvml (PyPI
 * nvidia-ml-py) runs end to end on machines without an NVIDIA GPU.
 *
 * State comes from a JSON scenario file (tests/fakenvml/scenarios/):
 *   1. the file named by $FAKENVML_SCENARIO, else
 *   2. "scenario.json" next to the path this library was loaded from
 *      (dladdr), because a Slurm Prolog runs with an empty environment and
 *      the lab gives every node its own directory with a symlink to us.
 * It is re-read whenever the init refcount goes 0 -> 1, so one process can
 * switch scenarios even though pynvml never unloads the library.
 *
 * Scenario: {"driver_version", "nvml_version", "init_error", "defaults": {GPU},
 * "gpus": [{GPU}, ...]}; GPU keys are listed in gpu_keys[] below (NVML units:
 * mW, mJ, MHz, bytes, Celsius).  Faults per GPU: "lost": true (every call,
 * handle lookup included, returns GPU_IS_LOST, as a GPU that fell off the
 * bus does), "fail": {"nvmlFunc": code}, "delay": {"nvmlFunc": ms},
 * "hang": ["nvmlFunc"] (the call never returns).  Keys starting with "_"
 * are comments; any other unknown key makes nvmlInit fail loudly.
 *
 * Own code, not derived from NVIDIA or third-party sources.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef FAKENVML_REAL_HEADER
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>
#else
#include "mini_nvml.h"
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 16
#define MAX_PROCS 32
#define MAX_XIDS 32
#define MAX_RULES 16
#define MAX_LINKS 18

_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
/* The bit values slurm_triage/collect/gpu.py decodes by name. */
_Static_assert(nvmlClocksEventReasonGpuIdle == 0x1, "idle bit");
_Static_assert(nvmlClocksEventReasonApplicationsClocksSetting == 0x2, "app clocks bit");
_Static_assert(nvmlClocksEventReasonSwPowerCap == 0x4, "sw power cap bit");
_Static_assert(nvmlClocksThrottleReasonHwSlowdown == 0x8, "hw slowdown bit");
_Static_assert(nvmlClocksEventReasonSyncBoost == 0x10, "sync boost bit");
_Static_assert(nvmlClocksEventReasonSwThermalSlowdown == 0x20, "sw thermal bit");
_Static_assert(nvmlClocksThrottleReasonHwThermalSlowdown == 0x40, "hw thermal bit");
_Static_assert(nvmlClocksThrottleReasonHwPowerBrakeSlowdown == 0x80, "hw power brake bit");
_Static_assert(nvmlClocksEventReasonDisplayClockSetting == 0x100, "display clock bit");

/* ------------------------------------------------------------------ */
/* a minimal JSON reader                                                */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jv {
    enum jtype t;
    unsigned long long u;        /* J_NUM (integers exact), J_BOOL */
    char *s;                     /* J_STR */
    char *key;                   /* member name inside an object */
    struct jv *child, *next;     /* J_ARR / J_OBJ members */
};

struct jparser { const char *p; const char *err; };

static void jfree(struct jv *v)
{
    while (v) {
        struct jv *n = v->next;
        jfree(v->child);
        free(v->s); free(v->key); free(v);
        v = n;
    }
}

static void jws(struct jparser *ps) { while (*ps->p && strchr(" \t\r\n", *ps->p)) ps->p++; }

static char *jstring(struct jparser *ps)
{
    size_t cap = 64, n = 0;
    char *out = malloc(cap);
    ps->p++;                                     /* opening quote */
    while (out && *ps->p && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\') {
            c = *ps->p++;
            switch (c) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': c = '?'; for (int k = 0; k < 4 && *ps->p; k++) ps->p++; break;
            case '"': case '\\': case '/': break;
            default: ps->err = "bad escape"; free(out); return NULL;
            }
        }
        if (n + 2 > cap) { char *grown = realloc(out, cap *= 2); if (!grown) { free(out); return NULL; } out = grown; }
        out[n++] = c;
    }
    if (!out) { ps->err = "out of memory"; return NULL; }
    if (*ps->p != '"') { ps->err = "unterminated string"; free(out); return NULL; }
    ps->p++;
    out[n] = '\0';
    return out;
}

static struct jv *jvalue(struct jparser *ps, int depth)
{
    struct jv *v;
    jws(ps);
    if (depth > 32) { ps->err = "nested too deep"; return NULL; }
    v = calloc(1, sizeof *v);
    if (!v) { ps->err = "out of memory"; return NULL; }
    if (*ps->p == '{' || *ps->p == '[') {
        int obj = *ps->p == '{';
        struct jv **tail = &v->child;
        v->t = obj ? J_OBJ : J_ARR;
        ps->p++;
        jws(ps);
        if (*ps->p == (obj ? '}' : ']')) { ps->p++; return v; }
        for (;;) {
            char *key = NULL;
            struct jv *m;
            jws(ps);
            if (obj) {
                if (*ps->p != '"') { ps->err = "expected a member name"; break; }
                if (!(key = jstring(ps))) break;
                jws(ps);
                if (*ps->p != ':') { ps->err = "expected ':'"; free(key); break; }
                ps->p++;
            }
            if (!(m = jvalue(ps, depth + 1))) { free(key); break; }
            m->key = key;
            *tail = m; tail = &m->next;
            jws(ps);
            if (*ps->p == ',') { ps->p++; continue; }
            if (*ps->p == (obj ? '}' : ']')) { ps->p++; return v; }
            ps->err = "expected ',' or a closing bracket";
            break;
        }
        jfree(v);
        return NULL;
    }
    if (*ps->p == '"') {
        v->t = J_STR;
        if (!(v->s = jstring(ps))) { free(v); return NULL; }
        return v;
    }
    if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
        v->t = J_BOOL; v->u = *ps->p == 't'; ps->p += v->u ? 4 : 5; return v;
    }
    if (!strncmp(ps->p, "null", 4)) { v->t = J_NULL; ps->p += 4; return v; }
    if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) {
        char *end;
        v->t = J_NUM;
        errno = 0;
        v->u = *ps->p == '-' ? (unsigned long long)strtoll(ps->p, &end, 10) : strtoull(ps->p, &end, 10);
        if (*end == '.' || *end == 'e' || *end == 'E') {   /* a fraction: keep the integer part */
            double d = strtod(ps->p, &end);
            v->u = (unsigned long long)(long long)d;
        }
        ps->p = end;
        return v;
    }
    ps->err = "unexpected character";
    free(v);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* scenario state                                                      */

struct rule { char func[96]; nvmlReturn_t code; unsigned int delay_ms; int hang; };

struct nvmlDevice_st {
    int present;
    unsigned int index, minor;
    char name[96], uuid[96], pci_bus_id[32];
    unsigned int pci_device_id, pci_subsystem_id;
    int temp_c, temp_shutdown_c, temp_slowdown_c, temp_gpu_max_c, temp_mem_max_c;
    unsigned int power_mw, power_limit_mw;
    unsigned long long energy_mj;
    unsigned int util_gpu, util_mem;
    unsigned long long mem_total, mem_reserved, mem_used;
    unsigned int clock[4], max_clock[4];           /* nvmlClockType_t order */
    unsigned long long event_reasons;
    unsigned long long ecc[2][2];                  /* [errorType][counterType] */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    int retired_pages_pending;
    unsigned int pcie_gen, pcie_gen_max, pcie_width, pcie_width_max;
    unsigned int nvlink_count, nvlink_down_mask;
    int persistence;
    int nprocs; nvmlProcessInfo_t procs[MAX_PROCS];
    int nxids, xid_cursor; unsigned long long xids[MAX_XIDS];
    int nrules; struct rule rules[MAX_RULES];
    int lost;
    int recovery_action;                           /* nvmlDeviceGpuRecoveryAction_t; -1: not supported */
};

struct nvmlEventSet_st { unsigned long long mask[MAX_GPUS]; };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static unsigned int g_count;
static char g_driver_version[80], g_nvml_version[80], g_scenario_path[4096];
static nvmlReturn_t g_init_error;
static struct nvmlDevice_st g_gpus[MAX_GPUS];

enum kind { K_STR, K_UINT, K_INT, K_U64, K_BOOL };
struct gpu_key { const char *name; enum kind kind; size_t off; size_t size; };
#define GK(n, k, field) {n, k, offsetof(struct nvmlDevice_st, field), sizeof(((struct nvmlDevice_st *)0)->field)}
static const struct gpu_key gpu_keys[] = {
    GK("name", K_STR, name), GK("uuid", K_STR, uuid), GK("pci_bus_id", K_STR, pci_bus_id),
    GK("pci_device_id", K_UINT, pci_device_id), GK("pci_subsystem_id", K_UINT, pci_subsystem_id),
    GK("minor", K_UINT, minor),
    GK("temp", K_INT, temp_c), GK("temp_shutdown", K_INT, temp_shutdown_c),
    GK("temp_slowdown", K_INT, temp_slowdown_c), GK("temp_gpu_max", K_INT, temp_gpu_max_c),
    GK("temp_mem_max", K_INT, temp_mem_max_c),
    GK("power_mw", K_UINT, power_mw), GK("power_limit_mw", K_UINT, power_limit_mw),
    GK("energy_mj", K_U64, energy_mj),
    GK("util_gpu", K_UINT, util_gpu), GK("util_mem", K_UINT, util_mem),
    GK("mem_total", K_U64, mem_total), GK("mem_reserved", K_U64, mem_reserved), GK("mem_used", K_U64, mem_used),
    GK("clock_graphics", K_UINT, clock[0]), GK("clock_sm", K_UINT, clock[1]),
    GK("clock_mem", K_UINT, clock[2]), GK("clock_video", K_UINT, clock[3]),
    GK("max_clock_graphics", K_UINT, max_clock[0]), GK("max_clock_sm", K_UINT, max_clock[1]),
    GK("max_clock_mem", K_UINT, max_clock[2]), GK("max_clock_video", K_UINT, max_clock[3]),
    GK("event_reasons", K_U64, event_reasons),
    GK("ecc_corrected_volatile", K_U64, ecc[0][0]), GK("ecc_corrected_aggregate", K_U64, ecc[0][1]),
    GK("ecc_uncorrected_volatile", K_U64, ecc[1][0]), GK("ecc_uncorrected_aggregate", K_U64, ecc[1][1]),
    GK("remap_corr", K_UINT, remap_corr), GK("remap_unc", K_UINT, remap_unc),
    GK("remap_pending", K_BOOL, remap_pending), GK("remap_failure", K_BOOL, remap_failure),
    GK("retired_pages_pending", K_BOOL, retired_pages_pending),
    GK("pcie_gen", K_UINT, pcie_gen), GK("pcie_gen_max", K_UINT, pcie_gen_max),
    GK("pcie_width", K_UINT, pcie_width), GK("pcie_width_max", K_UINT, pcie_width_max),
    GK("nvlink_count", K_UINT, nvlink_count), GK("persistence_mode", K_BOOL, persistence),
    GK("lost", K_BOOL, lost), GK("recovery_action", K_INT, recovery_action),
};

static unsigned long long jnum(const struct jv *v)
{
    if (v->t == J_STR) return strtoull(v->s, NULL, 0);   /* "0x233010DE" */
    return v->u;
}

static int add_rule(struct nvmlDevice_st *d, const char *func, nvmlReturn_t code, unsigned int ms, int hang)
{
    struct rule *r;
    if (d->nrules >= MAX_RULES) return -1;
    r = &d->rules[d->nrules++];
    snprintf(r->func, sizeof r->func, "%s", func);
    r->code = code; r->delay_ms = ms; r->hang = hang;
    return 0;
}

/* Apply one GPU object; returns NULL or a message naming the bad key. */
static const char *apply_gpu(struct nvmlDevice_st *d, const struct jv *obj)
{
    static char msg[160];
    for (const struct jv *m = obj->child; m; m = m->next) {
        size_t k, nkeys = sizeof gpu_keys / sizeof gpu_keys[0];
        if (m->key[0] == '_') continue;
        for (k = 0; k < nkeys && strcmp(gpu_keys[k].name, m->key); k++) {}
        if (k < nkeys) {
            const struct gpu_key *g = &gpu_keys[k];
            void *dst = (char *)d + g->off;
            unsigned long long n = m->t == J_STR && g->kind == K_STR ? 0 : jnum(m);
            switch (g->kind) {
            case K_STR:
                if (m->t != J_STR) goto bad;
                snprintf((char *)dst, g->size, "%s", m->s); break;
            case K_UINT: *(unsigned int *)dst = (unsigned int)n; break;
            case K_INT: *(int *)dst = (int)(long long)n; break;
            case K_U64: *(unsigned long long *)dst = n; break;
            case K_BOOL: *(int *)dst = n != 0; break;   /* int / unsigned int fields */
            }
            continue;
        }
        if (!strcmp(m->key, "procs") && m->t == J_ARR) {
            for (const struct jv *p = m->child; p && d->nprocs < MAX_PROCS; p = p->next) {
                nvmlProcessInfo_t *pi = &d->procs[d->nprocs++];
                if (p->t != J_ARR || !p->child || !p->child->next) goto bad;
                pi->pid = (unsigned int)jnum(p->child);
                pi->usedGpuMemory = jnum(p->child->next);
                pi->gpuInstanceId = pi->computeInstanceId = 0xFFFFFFFFu;   /* MIG off */
            }
        } else if (!strcmp(m->key, "xids") && m->t == J_ARR) {
            for (const struct jv *x = m->child; x && d->nxids < MAX_XIDS; x = x->next) d->xids[d->nxids++] = jnum(x);
        } else if (!strcmp(m->key, "nvlink_down") && m->t == J_ARR) {
            for (const struct jv *x = m->child; x; x = x->next) d->nvlink_down_mask |= 1u << (jnum(x) & 31);
        } else if ((!strcmp(m->key, "fail") || !strcmp(m->key, "delay")) && m->t == J_OBJ) {
            int fail = m->key[0] == 'f';
            for (const struct jv *r = m->child; r; r = r->next)
                if (add_rule(d, r->key, fail ? (nvmlReturn_t)jnum(r) : NVML_SUCCESS, fail ? 0 : (unsigned int)jnum(r), 0))
                    goto bad;
        } else if (!strcmp(m->key, "hang") && m->t == J_ARR) {
            for (const struct jv *r = m->child; r; r = r->next)
                if (r->t != J_STR || add_rule(d, r->s, NVML_SUCCESS, 0, 1)) goto bad;
        } else {
            goto bad;
        }
        continue;
    bad:
        snprintf(msg, sizeof msg, "bad or unknown GPU key '%s'", m->key);
        return msg;
    }
    return NULL;
}

static void set_defaults(struct nvmlDevice_st *d, unsigned int i)
{
    memset(d, 0, sizeof *d);
    d->present = 1;
    d->index = d->minor = i;
    snprintf(d->name, sizeof d->name, "Fake GPU");
    snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012u", i);
    snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", 0x10 + i);
}

static const char *scenario_path(void)
{
    const char *env = getenv("FAKENVML_SCENARIO");
    Dl_info info;
    if (env && *env) return env;
    if (dladdr((void *)&scenario_path, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        int dirlen = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(g_scenario_path, sizeof g_scenario_path, "%.*s/scenario.json",
                 dirlen, slash ? info.dli_fname : ".");
        return g_scenario_path;
    }
    return NULL;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
        else buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

/* Load the scenario; on any problem say why on stderr and fail nvmlInit. */
static void load_scenario_locked(void)
{
    const char *path = scenario_path(), *err = NULL;
    struct jparser ps = {0};
    struct jv *root = NULL, *defaults = NULL;
    char *text;

    memset(g_gpus, 0, sizeof g_gpus);
    g_count = 0;
    g_init_error = NVML_SUCCESS;
    snprintf(g_driver_version, sizeof g_driver_version, "0.0.0-fakenvml");
    snprintf(g_nvml_version, sizeof g_nvml_version, "0.0.0-fakenvml");
    if (!path || !(text = slurp(path))) {
        fprintf(stderr, "fakenvml: cannot read scenario %s: %s\n", path ? path : "(none)", strerror(errno));
        g_init_error = NVML_ERROR_DRIVER_NOT_LOADED;
        return;
    }
    ps.p = text;
    root = jvalue(&ps, 0);
    if (root && root->t != J_OBJ) err = "top level must be an object";
    if (!root) err = ps.err;
    for (struct jv *m = root && !err ? root->child : NULL; m && !err; m = m->next) {
        if (!strcmp(m->key, "defaults") && m->t == J_OBJ) defaults = m;
        else if (!strcmp(m->key, "driver_version") && m->t == J_STR)
            snprintf(g_driver_version, sizeof g_driver_version, "%s", m->s);
        else if (!strcmp(m->key, "nvml_version") && m->t == J_STR)
            snprintf(g_nvml_version, sizeof g_nvml_version, "%s", m->s);
        else if (!strcmp(m->key, "init_error")) g_init_error = (nvmlReturn_t)jnum(m);
        else if (strcmp(m->key, "gpus") && m->key[0] != '_') err = "unknown top-level key";
    }
    for (struct jv *m = root && !err ? root->child : NULL; m && !err; m = m->next) {
        if (strcmp(m->key, "gpus")) continue;
        if (m->t != J_ARR) { err = "gpus must be an array"; break; }
        for (struct jv *g = m->child; g && !err; g = g->next) {
            if (g_count >= MAX_GPUS || g->t != J_OBJ) { err = "too many GPUs or a GPU that is not an object"; break; }
            set_defaults(&g_gpus[g_count], g_count);
            if (defaults) err = apply_gpu(&g_gpus[g_count], defaults);
            if (!err) err = apply_gpu(&g_gpus[g_count], g);
            g_count++;
        }
    }
    if (err) {
        fprintf(stderr, "fakenvml: %s: %s (near offset %ld)\n", path, err, (long)(ps.p - text));
        g_init_error = NVML_ERROR_UNKNOWN;
        g_count = 0;
    }
    jfree(root);
    free(text);
}

/* ------------------------------------------------------------------ */
/* helpers                                                              */

static nvmlReturn_t dev_check(nvmlDevice_t d, const char *func)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    if (d < &g_gpus[0] || d >= &g_gpus[g_count] || !d->present) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    for (int k = 0; k < d->nrules; k++) {
        const struct rule *r = &d->rules[k];
        if (strcmp(r->func, func)) continue;
        while (r->hang) sleep(3600);                 /* a wedged driver call: only SIGKILL ends it */
        if (r->delay_ms) {
            struct timespec ts = {r->delay_ms / 1000, (long)(r->delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (r->code != NVML_SUCCESS) return r->code;
    }
    return NVML_SUCCESS;
}

#define DEV_GUARD(dev, out)                                        \
    nvmlReturn_t rc_ = dev_check((dev), __func__);                 \
    if (rc_ != NVML_SUCCESS) return rc_;                           \
    if (!(out)) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* init / shutdown / errors / system                                    */

static nvmlReturn_t do_init(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) load_scenario_locked();
    if (g_init_error != NVML_SUCCESS) rc = g_init_error;
    else g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
/* pynvml's nvmlInit() calls the C symbol nvmlInitWithFlags(0). */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) rc = NVML_ERROR_UNINITIALIZED;
    else g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch ((int)result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, g_driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, g_nvml_version);
}

/* ------------------------------------------------------------------ */
/* enumeration / identity                                               */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_count) return NVML_ERROR_INVALID_ARGUMENT;
    {
        DEV_GUARD(&g_gpus[index], device);
    }
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEV_GUARD(device, name);
    return copy_str(name, length, device->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEV_GUARD(device, uuid);
    return copy_str(uuid, length, device->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEV_GUARD(device, minorNumber);
    *minorNumber = device->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    unsigned int dom = 0, bus = 0, dev = 0, fn = 0;
    DEV_GUARD(device, pci);
    memset(pci, 0, sizeof *pci);
    sscanf(device->pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
    pci->domain = dom; pci->bus = bus; pci->device = dev;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", device->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xFFFF, bus, dev, fn);
    return NVML_SUCCESS;
}

/* Field values: only the GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, newer
 * drivers); any other field answers NOT_SUPPORTED in its own nvmlReturn, as NVML does. */
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    struct timespec now;
    DEV_GUARD(device, values);
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && device->recovery_action >= 0) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->nvmlReturn = NVML_SUCCESS;
            v->value.uiVal = (unsigned int)device->recovery_action;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    DEV_GUARD(device, mode);
    *mode = device->persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* thermals / power / utilisation / memory / clocks                     */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp)
{
    DEV_GUARD(device, temp);
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned int)device->temp_c;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEV_GUARD(device, temperature);
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = device->temp_c;
    return NVML_SUCCESS;
}

/* A threshold the scenario leaves at 0 answers NOT_SUPPORTED, as newer
 * drivers may on Ada and later (nvml.h: "no longer the preferred interface"). */
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                      nvmlTemperatureThresholds_t thresholdType,
                                                      unsigned int *temp)
{
    int v;
    DEV_GUARD(device, temp);
    switch ((int)thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: v = device->temp_shutdown_c; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: v = device->temp_slowdown_c; break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX:  v = device->temp_mem_max_c; break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX:  v = device->temp_gpu_max_c; break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    if (v <= 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned int)v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    DEV_GUARD(device, power);
    *power = device->power_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEV_GUARD(device, limit);
    *limit = device->power_limit_mw;
    return NVML_SUCCESS;
}

/* Energy counters of every process on this node: "energy.state" next to this library (or
 * $FAKENVML_ENERGY_STATE), one line "UUID MILLIJOULES BOOTTIME_NS" per GPU, under flock. */
#define MAX_ENERGY_LINES 256

static const char *energy_state_path(char *buf, size_t len)
{
    const char *env = getenv("FAKENVML_ENERGY_STATE");
    Dl_info info;
    if (env && *env) return env;
    if (dladdr((void *)&energy_state_path, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(buf, len, "%.*s/energy.state", (int)(slash - info.dli_fname), info.dli_fname);
            return buf;
        }
    }
    return NULL;
}

/* A counter, as on a real GPU: it integrates the power draw over time. Each read adds the
 * current power x the time since the last read of that GPU by any process (CLOCK_BOOTTIME
 * is the same in all of them), so it never falls, even when a scenario switch lowers the
 * power or changes the scenario's "energy_mj" (which only seeds a GPU's first read: that
 * value plus the power x time since boot). Without a writable state file it falls back to
 * that seed formula, which can fall on a switch. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    static char uuids[MAX_ENERGY_LINES][96];
    static unsigned long long mj[MAX_ENERGY_LINES], at[MAX_ENERGY_LINES];
    struct timespec now;
    unsigned long long now_ns, seed;
    char pathbuf[4200], text[MAX_ENERGY_LINES * 140];
    const char *path;
    int fd, n = 0, me = -1;
    ssize_t got;
    DEV_GUARD(device, energy);
    clock_gettime(CLOCK_BOOTTIME, &now);
    now_ns = (unsigned long long)now.tv_sec * 1000000000ULL + (unsigned long long)now.tv_nsec;
    seed = device->energy_mj + (unsigned long long)device->power_mw * (now_ns / 1000000ULL) / 1000ULL;
    *energy = seed;
    path = energy_state_path(pathbuf, sizeof pathbuf);
    if (!path || (fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666)) < 0) return NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (flock(fd, LOCK_EX) == 0) {
        (void)fchmod(fd, 0666);  /* the lab's hooks (root) and watchers (the user) share it */
        got = pread(fd, text, sizeof text - 1, 0);
        text[got > 0 ? got : 0] = '\0';
        for (char *line = text, *next; line && *line && n < MAX_ENERGY_LINES; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = '\0';
            if (sscanf(line, "%95s %llu %llu", uuids[n], &mj[n], &at[n]) == 3) {
                if (!strcmp(uuids[n], device->uuid)) me = n;
                n++;
            }
        }
        if (me < 0 && n < MAX_ENERGY_LINES) {
            me = n++;
            snprintf(uuids[me], sizeof uuids[me], "%s", device->uuid);
            mj[me] = seed;
        } else if (me >= 0 && now_ns > at[me]) {
            mj[me] += (unsigned long long)device->power_mw * ((now_ns - at[me]) / 1000000ULL) / 1000ULL;
        }
        if (me >= 0) {
            int len = 0;
            if (now_ns > at[me]) at[me] = now_ns;
            *energy = mj[me];
            for (int k = 0; k < n && len < (int)sizeof text - 140; k++)
                len += snprintf(text + len, sizeof text - (size_t)len, "%s %llu %llu\n", uuids[k], mj[k], at[k]);
            if (pwrite(fd, text, (size_t)len, 0) == len) (void)ftruncate(fd, len);
        }
        flock(fd, LOCK_UN);
    }
    pthread_mutex_unlock(&g_lock);
    close(fd);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEV_GUARD(device, utilization);
    utilization->gpu = device->util_gpu;
    utilization->memory = device->util_mem;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEV_GUARD(device, memory);
    memory->total = device->mem_total;
    memory->used = device->mem_used + device->mem_reserved;   /* v1: used includes reserved */
    memory->free = device->mem_total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEV_GUARD(device, memory);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->mem_total;
    memory->reserved = device->mem_reserved;
    memory->used = device->mem_used;
    memory->free = device->mem_total - device->mem_reserved - device->mem_used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    DEV_GUARD(device, clock);
    if ((unsigned int)type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    *clock = device->clock[type];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    DEV_GUARD(device, clock);
    if ((unsigned int)type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    *clock = device->max_clock[type];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *clocksEventReasons)
{
    DEV_GUARD(device, clocksEventReasons);
    *clocksEventReasons = device->event_reasons;
    return NVML_SUCCESS;
}

/* Deprecated alias (to be removed in CUDA 14); same bitmask. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *clocksThrottleReasons)
{
    DEV_GUARD(device, clocksThrottleReasons);
    *clocksThrottleReasons = device->event_reasons;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* ECC / row remapping / retired pages                                  */

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    DEV_GUARD(device, eccCounts);
    if ((unsigned int)errorType > 1 || (unsigned int)counterType > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *eccCounts = device->ecc[errorType][counterType];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    DEV_GUARD(device, corrRows && uncRows && isPending && failureOccurred);
    *corrRows = device->remap_corr;
    *uncRows = device->remap_unc;
    *isPending = device->remap_pending;
    *failureOccurred = device->remap_failure;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    DEV_GUARD(device, isPending);
    *isPending = device->retired_pages_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* PCIe / NVLink                                                        */

#define UINT_GETTER(fn, field)                                          \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out)      \
    {                                                                   \
        DEV_GUARD(device, out);                                         \
        if (!device->field) return NVML_ERROR_NOT_SUPPORTED;            \
        *out = device->field;                                           \
        return NVML_SUCCESS;                                            \
    }
UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_gen_max)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_width_max)

/* Links 0..nvlink_count-1 exist; a GPU without NVLink answers NOT_SUPPORTED. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    DEV_GUARD(device, isActive);
    if (!device->nvlink_count) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= device->nvlink_count || link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = (device->nvlink_down_mask >> link) & 1u ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* processes: NVML's two-call protocol                                  */

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    DEV_GUARD(device, infoCount);
    if (*infoCount < (unsigned int)device->nprocs) {
        *infoCount = (unsigned int)device->nprocs;  /* caller retries with a bigger array */
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (device->nprocs && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < device->nprocs; k++) infos[k] = device->procs[k];
    *infoCount = (unsigned int)device->nprocs;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* events (XID), for a long-running watcher                             */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(struct nvmlEventSet_st));
    return *set ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set)
{
    DEV_GUARD(device, set);
    if (eventTypes & ~(unsigned long long)nvmlEventTypeXidCriticalError) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[device->index] |= eventTypes;
    return NVML_SUCCESS;
}

static int pop_event_locked(nvmlEventSet_t set, nvmlEventData_t *data)
{
    for (unsigned int i = 0; i < g_count; i++) {
        struct nvmlDevice_st *d = &g_gpus[i];
        if (!(set->mask[i] & nvmlEventTypeXidCriticalError) || d->xid_cursor >= d->nxids) continue;
        data->device = d;
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = d->xids[d->xid_cursor++];  /* each XID is delivered once */
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        return 1;
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec step = {0, 10 * 1000 * 1000};
    unsigned int waited = 0;
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    for (;;) {
        int got;
        pthread_mutex_lock(&g_lock);
        got = pop_event_locked(set, data);
        pthread_mutex_unlock(&g_lock);
        if (got) return NVML_SUCCESS;
        if (waited >= timeoutms) return NVML_ERROR_TIMEOUT;
        nanosleep(&step, NULL);
        waited += 10;
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!g_refcount) return NVML_ERROR_UNINITIALIZED;
    free(set);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* test-only surface (not NVML): tests assert which library is bound    */

EXPORT int fakenvml_is_fake(void) { return 1; }

/* The scenario file the last nvmlInit read (NULL before the first). */
EXPORT const char *fakenvml_scenario_path(void)
{
    const char *env = getenv("FAKENVML_SCENARIO");
    return env && *env ? env : (g_scenario_path[0] ? g_scenario_path : NULL);
}
