/* Runs a command under a seccomp filter that answers the Landlock syscalls with an errno, as a
 * container's seccomp profile or a kernel without Landlock would: nolandlock ENOSYS|EPERM CMD...
 * Everything else is allowed. x86_64 and aarch64 share the Landlock numbers (444-446). */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: nolandlock ENOSYS|EPERM CMD...\n");
        return 2;
    }
    unsigned err = strcmp(argv[1], "EPERM") == 0 ? EPERM : ENOSYS;
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 444, 0, 2),
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 446, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | err),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("nolandlock: seccomp");
        return 2;
    }
    execvp(argv[2], argv + 2);
    perror("nolandlock: exec");
    return 127;
}
