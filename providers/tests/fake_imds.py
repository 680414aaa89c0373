# EC2's instance metadata service as skyport's exit-server boot script uses it, following AWS's
# description of IMDSv2: PUT /latest/api/token with a TTL header gives a token, every read needs
# it (401 without), `mac` and `local-ipv4` name the primary interface and address, and
# network/interfaces/macs/<mac>/local-ipv4s lists its private IPv4s one a line, the primary
# first. The secondary address shows up only from the third listing on, as one assigned after
# launch would. Usage: fake_imds.py <bind address> <port>
import http.server, sys
listed = 0
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, code, body):
        self.send_response(code); self.end_headers(); self.wfile.write(body.encode())
    def do_PUT(self):
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.reply(200 if ok else 400, "tok" if ok else "")
    def do_GET(self):
        global listed
        if self.headers.get("X-aws-ec2-metadata-token") != "tok": return self.reply(401, "")
        m = "/latest/meta-data/"
        if self.path == m + "mac": return self.reply(200, "0e:00:00:00:00:01")
        if self.path == m + "local-ipv4": return self.reply(200, "172.31.5.10")
        if self.path == m + "network/interfaces/macs/0e:00:00:00:00:01/local-ipv4s":
            listed += 1
            return self.reply(200, "172.31.5.10\n172.31.5.77" if listed > 2 else "172.31.5.10")
        self.reply(404, "")
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
