// Agent's service: listens on argv[1]; as the service user, spins SIGSTOPping the newest pid and
// the next (ns_last_pid, +1): verify's kill child, between its setresuid to the service user and
// its kill(-1). Writes argv[2] when a stop took on a process not its own.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
static int lastpid(void) {
    char b[32] = {0};
    int fd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY);
    if (fd < 0) return -1;
    int n = read(fd, b, sizeof b - 1);
    close(fd);
    return n > 0 ? atoi(b) : -1;
}
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])), .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(s, (void *)&a, sizeof a) || listen(s, 16)) return 2;
    if (getuid() != 65530) { for (;;) pause(); }
    pid_t mine[2];
    mine[0] = getpid();
    mine[1] = fork();
    if (mine[1] == 0) mine[1] = getpid();
    int last_hit = -1;
    for (;;) {
        int n = lastpid();
        for (int i = 0; i < 400; i++) {
            for (int t = n; t <= n + 1; t++) {
                if (t == mine[0] || t == mine[1]) continue;
                if (kill(t, SIGSTOP) == 0 && t != last_hit) {
                    last_hit = t;
                    int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0666);
                    char b[32]; int m = snprintf(b, sizeof b, "%d\n", t); write(fd, b, m); close(fd);
                }
            }
        }
    }
}
