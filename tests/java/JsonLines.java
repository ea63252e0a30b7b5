import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;

/**
 * What every Java probe of the tests shares (tests/java_probes.py compiles it with each): the loop that reads
 * one command a line on stdin ("name arg..." separated by spaces) and answers each with one JSON line on
 * stdout, a failure answered {"error": class, "message": ...} with its causes.
 */
final class JsonLines {
    interface Commands {
        Object run(String command, String[] args) throws Exception;
    }

    private JsonLines() {}

    static void serve(Commands commands) throws IOException {
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split(" ");
            Object answer;
            try {
                answer = commands.run(words[0], Arrays.copyOfRange(words, 1, words.length));
            } catch (Throwable e) {
                answer = error(e);
            }
            out.println(json(answer));
        }
    }

    static Map<String, Object> error(Throwable e) {
        Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("error", cause.getClass().getSimpleName());
        StringBuilder message = new StringBuilder(String.valueOf(cause.getMessage()));
        for (Throwable inner = cause.getCause(); inner != null; inner = inner.getCause())
            message.append(" <- ").append(inner);
        answer.put("message", message.toString());
        return answer;
    }

    static String json(Object value) {
        if (value == null) return "null";
        if (value instanceof Number || value instanceof Boolean) return value.toString();
        if (value instanceof Map) {
            StringBuilder text = new StringBuilder("{");
            String separator = "";
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                text.append(separator).append(json(String.valueOf(entry.getKey()))).append(": ")
                    .append(json(entry.getValue()));
                separator = ", ";
            }
            return text.append("}").toString();
        }
        if (value instanceof List) {
            StringBuilder text = new StringBuilder("[");
            String separator = "";
            for (Object item : (List<?>) value) {
                text.append(separator).append(json(item));
                separator = ", ";
            }
            return text.append("]").toString();
        }
        StringBuilder text = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') text.append('\\').append(c);
            else if (c < 0x20) text.append(String.format("\\u%04x", (int) c));
            else text.append(c);
        }
        return text.append('"').toString();
    }
}
