/* names.c — names of devices, a2a transports and activation modes, and the
 * mapping from activation mode to its weight format. The exact numeric
 * definition of each activation mode lives in actmode.c. */
#include <string.h>

#include "moerun/moe.h"

static const char *const device_names[MR_DEVICE_COUNT] = {
    [MR_DEVICE_CPU] = "cpu",     [MR_DEVICE_SM90] = "sm90",   [MR_DEVICE_SM100] = "sm100",
    [MR_DEVICE_SM103] = "sm103", [MR_DEVICE_SM110] = "sm110", [MR_DEVICE_SM120] = "sm120",
};

const char *mr_device_name(mr_device d) {
    if ((int)d < 0 || d >= MR_DEVICE_COUNT) return "unknown";
    return device_names[d];
}

mr_status mr_device_from_name(const char *name, mr_device *out) {
    for (int i = 0; name && i < MR_DEVICE_COUNT; i++)
        if (!strcmp(name, device_names[i])) {
            *out = (mr_device)i;
            return MR_OK;
        }
    return mr_error_set(MR_EINVAL, "unknown device '%s' (expected cpu, sm90, sm100, sm103, sm110 or sm120)",
                        name ? name : "(null)");
}

static const char *const a2a_names[MR_A2A_COUNT] = {[MR_A2A_NONE] = "none", [MR_A2A_MPI] = "mpi"};

const char *mr_a2a_name(mr_a2a a) {
    if ((int)a < 0 || a >= MR_A2A_COUNT) return "unknown";
    return a2a_names[a];
}

mr_status mr_a2a_from_name(const char *name, mr_a2a *out) {
    for (int i = 0; name && i < MR_A2A_COUNT; i++)
        if (!strcmp(name, a2a_names[i])) {
            *out = (mr_a2a)i;
            return MR_OK;
        }
    return mr_error_set(MR_EINVAL, "unknown a2a transport '%s' (expected none or mpi)", name ? name : "(null)");
}

/* mpi dispatches each token's rows to the rank owning the expert, so it must
 * know the ids before the experts run. */
bool mr_a2a_needs_routing_first(mr_a2a a) { return a == MR_A2A_MPI; }

static const struct {
    const char *name;
    mr_format weight_format;
} act_modes[MR_ACT_COUNT] = {
    [MR_ACT_AUTO] = {"auto", MR_FMT_COUNT},        [MR_ACT_W16A32] = {"w16a32", MR_FMT_BF16},
    [MR_ACT_W16A16] = {"w16a16", MR_FMT_BF16},     [MR_ACT_W8A8] = {"w8a8", MR_FMT_FP8_BLOCK},
    [MR_ACT_W8A16] = {"w8a16", MR_FMT_FP8_BLOCK},  [MR_ACT_W4A4] = {"w4a4", MR_FMT_NVFP4},
    [MR_ACT_W4A8] = {"w4a8", MR_FMT_NVFP4},        [MR_ACT_W4A16] = {"w4a16", MR_FMT_NVFP4},
};

const char *mr_act_mode_name(mr_act_mode m) {
    if ((int)m < 0 || m >= MR_ACT_COUNT) return "unknown";
    return act_modes[m].name;
}

mr_status mr_act_mode_from_name(const char *name, mr_act_mode *out) {
    for (int i = 0; name && i < MR_ACT_COUNT; i++)
        if (!strcmp(name, act_modes[i].name)) {
            *out = (mr_act_mode)i;
            return MR_OK;
        }
    return mr_error_set(MR_EINVAL,
                        "unknown activation mode '%s' (expected auto, w16a32, w16a16, w8a8, w8a16, w4a4, w4a8 or w4a16)",
                        name ? name : "(null)");
}

mr_format mr_act_mode_weight_format(mr_act_mode m) {
    if ((int)m < 0 || m >= MR_ACT_COUNT) return MR_FMT_COUNT;
    return act_modes[m].weight_format;
}

mr_act_mode mr_act_mode_default(mr_format weight_format) {
    switch (weight_format) {
    case MR_FMT_BF16: return MR_ACT_W16A32;
    case MR_FMT_FP8_BLOCK: return MR_ACT_W8A8;
    case MR_FMT_NVFP4: return MR_ACT_W4A4;
    default: return MR_ACT_AUTO;
    }
}
